"""The options several backends take, declared once: one key, one meaning, one check.

A backend takes one by naming it in its options, under the name its code
reads; ``but`` changes only what differs (its default, the policies it
supports)::

    OPTIONS = {
        "capacity": but(CAPACITY, required=True),
        "eviction": eviction(("lru", "s3fifo")),
        "io_threads": but(CONCURRENCY, default=4),   # written `concurrency`
    }

Where the backend's name is not the shared key (``io_threads`` above), the
file writes the shared key, and the backend's name still works for a release,
with a warning naming the shared key (:attr:`~kvtier.spec.Option.key`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from .types import Option

__all__ = ["CAPACITY", "CONCURRENCY", "CONNECT_TIMEOUT", "SHARED", "TIMEOUT", "but", "eviction"]


def _positive(value: float) -> None:
    if value <= 0:  # 0 would refuse every put, or wait for nothing
        raise ValueError(f"expected more than 0, got {value}")


def _at_least_one(value: int) -> None:
    if value < 1:
        raise ValueError(f"expected 1 or more, got {value}")


def but(option: Option, **changes: Any) -> Option:
    """``option`` with ``changes`` (a backend's default, its choices), its key kept."""
    return dataclasses.replace(option, **changes)


def _at_least_one_byte(value: int) -> None:
    if value < 1:  # 0 would refuse every put, silently
        raise ValueError(f"expected at least 1 byte, got {value}; leave it unset for no bound")


CAPACITY = Option(
    "size", "bytes of blocks kept before the eviction policy drops some (8GiB, 500MB); "
    "unset: unbounded", check=_at_least_one_byte, key="capacity")


def eviction(choices: Iterable[str], default: str | None = None) -> Option:
    """The ``eviction`` option of a backend that supports the policies ``choices``."""
    names = tuple(choices)
    return Option("str", f"which block the capacity drops first: {', '.join(names)} "
                  "(docs/settings.md)", default=names[0] if default is None else default,
                  choices=names, key="eviction")


CONCURRENCY = Option(
    "int", "operations one batch runs at once: threads (fs), requests in flight (object), "
    "connections (peer: per peer; redis: in all)", check=_at_least_one, key="concurrency")
TIMEOUT = Option(
    "duration", "the longest one batch waits (a request, a free connection, room in a "
    "pool); slower is a miss or a refused put", check=_positive, key="timeout")
CONNECT_TIMEOUT = Option(
    "duration", "the longest connecting (and a handshake) may take", check=_positive,
    key="connect_timeout")

#: Every shared option, by its key (``eviction`` with one policy: each backend names its
#: own).  ``sizing_sample`` is shared too, declared with the miniatures it samples for
#: (:data:`kvtier.policies.sizing.SIZING_OPTION`).
SHARED: dict[str, Option] = {
    "capacity": CAPACITY, "eviction": eviction(("lru",)),
    "concurrency": CONCURRENCY, "timeout": TIMEOUT, "connect_timeout": CONNECT_TIMEOUT,
}
