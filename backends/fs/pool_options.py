"""The ``fs`` pool's options (:mod:`kvtier.backends.fs.pool`) and their checks, and the
name of its index under a root.

Where the pool is not used is :mod:`.mounts`; each writer's journal and whether it
is alive, :mod:`.pool_writers`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kvtier.spec import Option, Renamed
from kvtier.spec.shared import TIMEOUT, but

__all__ = ["DB_NAME", "LEASE_MIN_S", "POOL_OPTIONS", "parse_min_free"]

DB_NAME = ".kvtier-pool.db"
_PERCENT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def _check_min_free(value: str | int) -> None:
    parse_min_free(value)


#: The shortest ``pool_lease``: a put waits for the lease, or for the writes of other
#: processes to land and get their rows (so that they can be evicted), at most this
#: long.  Those rows are made within ``_STALE_S`` (0.5 s) while their writer puts:
#: a shorter wait refuses puts that would fit a moment later (0s refused 164-194
#: puts per writer of four).  Twice that, so that one late flush still fits.
LEASE_MIN_S = 1.0


def _check_lease(value: float) -> None:
    if value < LEASE_MIN_S:
        raise ValueError(
            f"expected at least {LEASE_MIN_S:g}s, got {value:g}s: a put waits this long for "
            "another process's eviction or writes in flight (their rows come within 0.5s), "
            "so a shorter lease refuses puts that would fit")


def parse_min_free(value: str | int) -> tuple[int, float]:
    """``(bytes, fraction)``: one of them is 0."""
    from kvtier.plugins.options import parse_size  # the options' own parser, one home

    match = _PERCENT_RE.match(str(value))
    if match:
        pct = float(match.group(1))
        if not 0 < pct < 100:
            raise ValueError(f"expected a percent between 0 and 100, got {value!r}")
        return 0, pct / 100
    size = parse_size(value)
    if size < 1:
        raise ValueError(f"expected bytes (4GiB) or a percent (10%), got {value!r}")
    return size, 0.0


def _scope_of_pool(pool: bool, scope: str | None) -> str | None:
    """The old ``pool: false`` is ``capacity_scope: process``; with ``capacity_scope: pool``
    it is a contradiction (no pool to bound), refused."""
    if pool:
        return scope
    if scope == "pool":
        raise ValueError("pool: false contradicts capacity_scope: pool (every namespace of the "
                         "root needs the shared index); write capacity_scope: process or pool")
    return "process"


POOL_OPTIONS: Mapping[str, Option] = {
    "capacity_scope": Option(
        "str",
        "what the capacity and min_free bound, on a local root: namespace (this tier's "
        "namespace, for every process sharing the root together: a shared index, "
        "<root>/.kvtier-pool.db), pool (every namespace of the root together) or process "
        "(each process its own blocks, no shared index)",
        default="namespace",
        choices=("namespace", "pool", "process"),
        was=(Renamed("pool", "bool", _scope_of_pool),),
    ),
    "min_free": Option(
        "size_or_percent",
        "local roots: keep this much of the filesystem free (4GiB, 4096 or 10%): puts evict to "
        "stay above it, and are refused when they cannot",
        default=None,
        check=_check_min_free,
    ),
    "pool_lease": but(
        TIMEOUT,
        help="how long the evictor's lease lasts (at least 1s): a dead evictor is replaced "
        "within it, and a put waits at most this long for room",
        default="10s",
        check=_check_lease,
    ),
}
