"""The ``fs`` backend's I/O threads: one batch spread over them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from .._batch import Failed

__all__ = ["run_batch"]

T = TypeVar("T")
R = TypeVar("R")


def run_batch(
    pool: ThreadPoolExecutor | None, workers: int, fn: Callable[[T], R], items: Sequence[T]
) -> list[R]:
    """``[fn(x) for x in items]`` on up to ``workers`` threads of ``pool``, results in order.

    Workers pull the next item from a shared cursor, so one slow file does
    not hold up a fixed share of the batch, and the calling thread works too
    instead of waiting.  The first exception is raised only once every item
    has finished, so no I/O of the batch is left running behind the caller.
    Without a pool, or for one item, the calling thread does it all.
    """
    n = len(items)
    if n <= 1 or pool is None:
        return [fn(x) for x in items]
    results: list[Any] = [None] * n
    lock = threading.Lock()
    cursor = [0]

    def work() -> None:
        while True:
            with lock:
                i = cursor[0]
                cursor[0] = i + 1
            if i >= n:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as exc:
                results[i] = Failed(exc)

    futures: list[Future[None]] = []
    for _ in range(min(workers, n) - 1):
        try:
            futures.append(pool.submit(work))
        except RuntimeError:
            break  # the pool was shut down meanwhile: finish the batch here
    work()
    for future in futures:
        future.result()
    for r in results:
        if isinstance(r, Failed):
            raise r.exc
    return results
