"""One reading per round of a store's every-tenant figures, whatever the number of tenants.

Each tenant's chain opens its own instance of a tier's backend, and a store
that tenants share (the ``fs`` shared pool) reports every tenant's figures
(``tenant_bytes.<t>``, ...) through each of them.  Reading the stats of N
tenants' chains then read the store's per-tenant table N times and handed the
caller N copies of N tenants' figures: N^2 work per read (97 s for 1,000
tenants, BENCHMARKS.md "Per-tenant figures").

A caller that reads many tenants' instances at once (``Tenants.stats()``, a
Prometheus scrape) does so in a :func:`tenant_round`.  Inside it, a store's
every-tenant figures are read once, by the first of its instances asked
(:func:`read_once` answers ``first``), which reports them all; the others
report only their own tenant's, taken from that reading.  Outside a round
each instance reads and reports them all, as one chain's stats always did.

A round belongs to the thread (a context variable) that opened it: the
chains' stats are read in that thread.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

__all__ = ["read_once", "tenant_round"]

T = TypeVar("T")

_ROUND: contextvars.ContextVar[dict[Hashable, Any] | None] = contextvars.ContextVar(
    "kvtier_tenant_round", default=None)


@contextlib.contextmanager
def tenant_round() -> Iterator[None]:
    """A round of reading many tenants' instances; one inside another is the outer one."""
    if _ROUND.get() is not None:
        yield
        return
    token = _ROUND.set({})
    try:
        yield
    finally:
        _ROUND.reset(token)


def read_once(store: Hashable, read: Callable[[], T]) -> tuple[T, bool]:
    """``read()``'s answer for ``store`` (a key naming it, the same for each of its
    instances), and whether it is the round's first: report every tenant's figures;
    else only the caller's own.  Outside a round, always read, always first."""
    seen = _ROUND.get()
    if seen is None:
        return read(), True
    if store in seen:
        return seen[store], False
    value = seen[store] = read()
    return value, True
