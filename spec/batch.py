"""Helpers for a hook's batch that every backend needs alike.

Public so that a backend of another distribution imports them rather than
keeping copies: the length check of a batch, the first occurrence of each
key, and one batch spread over a thread pool with failures caught per item.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, MutableSequence, Sequence
from concurrent.futures import Executor, Future
from typing import Any, Generic, TypeVar

__all__ = ["Failed", "check_batch", "earliest_deadlines", "first_positions", "map_batch",
           "run_batch"]

E = TypeVar("E", bound=BaseException)
T = TypeVar("T")
R = TypeVar("R")


class Failed(Generic[E]):
    """An exception caught for one item (in a worker thread), for the caller to handle."""

    __slots__ = ("exc",)

    def __init__(self, exc: E) -> None:
        self.exc = exc

    def __repr__(self) -> str:
        return f"Failed({self.exc!r})"


def check_batch(keys: Sequence[bytes], other: Sequence[object], what: str = "blocks") -> None:
    """Raise ``ValueError`` unless ``other`` has one item per key."""
    if len(keys) != len(other):
        raise ValueError(f"batch of {len(keys)} keys but {len(other)} {what}")


def first_positions(keys: Sequence[bytes]) -> dict[bytes, int]:
    """Each distinct key of a batch and where it first occurs, in batch order."""
    first: dict[bytes, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    return first


def earliest_deadlines(
    known: MutableSequence[float | None],
    answer: Iterable[float | None],
    at: Iterable[int] | None = None,
) -> None:
    """Join one ``kvtier_deadlines`` answer into ``known``: per key the fewer seconds left.

    For a store over several (a chain's tiers, a backend's servers): a block
    expires at the earliest deadline any of them holds, so that is what the
    whole answers.  ``at`` places each answer in ``known``, for an answer
    about part of the batch (in order by default); None knows no deadline.
    """
    for i, left in zip(range(len(known)) if at is None else at, answer):
        mine = known[i]
        if left is not None and (mine is None or left < mine):
            known[i] = left


def map_batch(
    pool: Executor | None,
    workers: int,
    fn: Callable[[T], R],
    items: Sequence[T],
    catch: type[Exception] | tuple[type[Exception], ...] = Exception,
) -> list[R | Failed[Exception]]:
    """``fn`` over ``items`` on up to ``workers`` threads of ``pool``, results in order.

    An exception of a ``catch`` type is caught per item and stands in its
    place as :class:`Failed`; any other (``KeyboardInterrupt`` included)
    propagates once every item has finished.  Workers pull the next item
    from a shared cursor, so one slow item does not hold up a fixed share of
    the batch, and the calling thread works too instead of waiting.  Without
    a pool, for one item, or once the pool is shut down, the calling thread
    does it all.
    """
    n = len(items)
    results: list[Any] = [None] * n
    lock = threading.Lock()
    cursor = [0]
    escaped: list[BaseException] = []

    def work() -> None:
        while True:
            with lock:
                i = cursor[0]
                cursor[0] = i + 1
            if i >= n:
                return
            try:
                results[i] = fn(items[i])
            except catch as exc:
                results[i] = Failed(exc)
            except BaseException as exc:  # still let every other item finish
                escaped.append(exc)

    futures: list[Future[None]] = []
    if pool is not None and n > 1:
        for _ in range(min(workers, n) - 1):
            try:
                futures.append(pool.submit(work))
            except RuntimeError:
                break  # the pool was shut down meanwhile: finish the batch here
    work()
    for future in futures:
        future.result()
    if escaped:
        raise escaped[0]
    return results


def run_batch(
    pool: Executor | None, workers: int, fn: Callable[[T], R], items: Sequence[T]
) -> list[R]:
    """:func:`map_batch` where any failure fails the batch.

    The first exception, in item order, is raised only once every item has
    finished, so no work of the batch is left running behind the caller.
    """
    results = map_batch(pool, workers, fn, items)
    for r in results:
        if isinstance(r, Failed):
            raise r.exc
    return results  # type: ignore[return-value]  # no Failed is left
