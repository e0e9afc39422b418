"""The options several backends take, declared once: one key, one meaning, one check.

A backend takes one by naming it in its options, under the name its code
reads; ``but`` changes only what differs (its default, the policies it
supports)::

    OPTIONS = {
        "capacity": CAPACITY.but(required=True),
        "eviction": eviction(("lru", "s3fifo")),
        "io_threads": CONCURRENCY.but(default=4),   # written `concurrency`
    }

Where the backend's name is not the shared key (``io_threads`` above), the
file writes the shared key, and the backend's name still works for a release,
with a warning naming the shared key (:attr:`~kvtier.spec.Option.key`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .types import Option

__all__ = ["CAPACITY", "CONCURRENCY", "CONNECT_TIMEOUT", "SHARED", "SIZING_SAMPLE", "TIMEOUT",
           "but", "eviction"]


def _positive(value: float) -> None:
    if value <= 0:  # 0 would refuse every put, or wait for nothing
        raise ValueError(f"expected more than 0, got {value}")


def _at_least_one(value: int) -> None:
    if value < 1:
        raise ValueError(f"expected 1 or more, got {value}")


def _share(value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"expected a share from 0 to 1, got {value:g}")


def but(option: Option, **changes: Any) -> Option:
    """``option`` with ``changes`` (a backend's default, its choices), its key kept."""
    return dataclasses.replace(option, **changes)


CAPACITY = Option(
    "size", "bytes of blocks kept before the eviction policy drops some (8GiB, 500MB); "
    "unset: unbounded", check=_positive, key="capacity")


def eviction(choices: tuple[str, ...], default: str | None = None) -> Option:
    """The ``eviction`` option of a backend that supports the policies ``choices``."""
    return Option("str", "which block the capacity drops first: "
                  f"{', '.join(choices)} (docs/settings.md)",
                  default=choices[0] if default is None else default, choices=choices,
                  key="eviction")


SIZING_SAMPLE = Option(
    "float", "share of keys fed to miniature simulations that estimate the hit ratio at "
    "0.5x, 2x and 4x the capacity (stats' sizing_hit_ratio_*; 0: off)", default=0.01,
    check=_share, key="sizing_sample")
CONCURRENCY = Option(
    "int", "operations one batch runs at once: threads (fs), requests in flight (object), "
    "connections (peer: per peer; redis: in all)", check=_at_least_one, key="concurrency")
TIMEOUT = Option(
    "duration", "the longest one batch waits (a request, a free connection, room in a "
    "pool); slower is a miss or a refused put", check=_positive, key="timeout")
CONNECT_TIMEOUT = Option(
    "duration", "the longest connecting (and a handshake) may take", check=_positive,
    key="connect_timeout")

#: Every shared option, by its key (``eviction`` with one policy: each backend names its own).
SHARED: dict[str, Option] = {
    "capacity": CAPACITY, "eviction": eviction(("lru",)), "sizing_sample": SIZING_SAMPLE,
    "concurrency": CONCURRENCY, "timeout": TIMEOUT, "connect_timeout": CONNECT_TIMEOUT,
}
