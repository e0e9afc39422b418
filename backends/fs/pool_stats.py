"""What a process under the shared pool (:mod:`kvtier.backends.fs.pool`) reports in
``stats()``.

The scope's truth from the index (``used_bytes``, ``blocks``), beside this
process's own share: its count alone kept every block it wrote or found,
whoever evicted it since, and grew without bound (27.6 MB for a 1 MiB pool).
Other processes' writes are counted once they have their rows, within 50 ms
of their last put; the blocks and the own share are counted at most once a
second (:meth:`.PoolPolicy.counts`).  The figures are read outside a
transaction: no lock of the index, only the session's, so that no flush runs
meanwhile.

What is the root's, the same through every instance (each tenant's figures,
the pool's own files), is read once per round of stats
(:mod:`kvtier.policies.tenant_round`): ``Tenants.stats()`` reads N tenants'
instances of one root, and each reading every tenant's figures cost N^2.  In a
round the first instance reports every tenant's, the others their own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from kvtier.policies.tenant_round import read_once

from .pool_db import IndexReplaced

if TYPE_CHECKING:
    from .pool import SharedPool

__all__ = ["kept_figures", "pool_stats"]

Figures = tuple[int, int, int, tuple[int, int, int]]
T = TypeVar("T")
#: What a tenant's own figures are named, in a round's later instances.
_OWN = ("tenant_bytes.", "tenant_kept_bytes.", "tenant_refused.", "tenant_evicted.",
        "tenant_keep_refused.")


def _read(pool: SharedPool, figures: Callable[[sqlite3.Connection], T]) -> T:
    try:
        return pool.session.read(figures)
    except IndexReplaced:  # counted again in the new index: read that one
        return pool.session.read(figures)


def _root_figures(pool: SharedPool) -> tuple[int, dict[str, int]]:
    """The root's: its own files' bytes, and each tenant's figures, every process's
    (.pool_tenants; none without tenants)."""
    tenants = _read(pool, pool.tenancy.figures) if pool.tenancy.active else {}
    return pool.measure_files(), tenants


def pool_stats(pool: SharedPool) -> dict[str, int]:
    """``pool``'s figures for the backend's ``stats()`` (docs/shared-capacity.md)."""

    def figures(db: sqlite3.Connection) -> Figures:
        """The scope's bytes and bytes in flight, the bytes of this process's writes
        landed that have no row yet (counted in flight until then), and the rows
        counted."""
        used, inflight = db.execute("SELECT bytes, inflight FROM totals WHERE scope = ?",
                                    (pool.scope,)).fetchall()[0]
        landed, stored = pool.landed_now()
        return used, inflight, stored, pool.policy.counts(db, pool.ns, pool.me, landed, stored)

    used, inflight, stored, (blocks, own_blocks, own_bytes) = _read(pool, figures)
    (files_bytes, tenants), first = read_once(("fs pool", pool.root),
                                              lambda: _root_figures(pool))
    if not first:  # another instance of the round reported every tenant's: its own only
        tenant = pool.tenancy.tenant
        tenants = {k: tenants[k] for k in (*(p + tenant for p in _OWN), "catalog_bytes")
                   if k in tenants}
    out = {"used_bytes": used - inflight + stored, "blocks": blocks,
           "own_used_bytes": own_bytes, "own_blocks": own_blocks,
           "pool_bytes": used, "pool_inflight_bytes": inflight,
           # the pool's own files, counted in its capacity (.pool_files)
           "pool_files_bytes": files_bytes,
           "pool_evictions": pool.evictor.evicted_blocks, "pool_refused": pool.refused,
           # of those, refused by this tier's tenant's quota (.pool_tenants)
           "refused_quota": pool.refused_quota,
           # damaged indexes this process replaced, and those others replaced (.pool_db)
           "index_rebuilds": pool.session.rebuilds,
           "index_switches": pool.session.switches}
    if pool.capacity is not None:
        out["pool_capacity_bytes"] = out["capacity_bytes"] = pool.capacity
    out.update(tenants)
    out.update(kept_figures(pool, tenants))
    return out


def kept_figures(pool: SharedPool, tenants: dict[str, int]) -> dict[str, int]:
    """The bytes of the kept blocks of this tier's tenant, every process's (from
    ``tenants``, the pool's per-tenant figures, where it counts tenants), and the marks
    this process refused (:mod:`.pool_keep`)."""
    def kept(db: sqlite3.Connection) -> int:
        mine = pool.tenancy.namespaces(db, pool.tenancy.tenant, "*")
        return pool.kept.kept_bytes(db, [*mine, pool.ns])

    if pool.tenancy.active:
        kept_bytes = tenants.get(f"tenant_kept_bytes.{pool.tenancy.tenant}", 0)
    else:
        kept_bytes = _read(pool, kept)
    return {"kept_bytes": kept_bytes, "keep_refused": pool.kept.refused}
