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
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from .pool_db import IndexReplaced

if TYPE_CHECKING:
    from .pool import SharedPool

__all__ = ["kept_figures", "pool_stats"]

Figures = tuple[int, int, int, tuple[int, int, int], dict[str, int]]


def pool_stats(pool: SharedPool) -> dict[str, int]:
    """``pool``'s figures for the backend's ``stats()`` (docs/shared-capacity.md)."""
    session = pool.session

    def figures(db: sqlite3.Connection) -> Figures:
        """The scope's bytes and bytes in flight, the bytes of this process's writes
        landed that have no row yet (counted in flight until then), and the rows
        counted."""
        used, inflight = db.execute("SELECT bytes, inflight FROM totals WHERE scope = ?",
                                    (pool.scope,)).fetchall()[0]
        landed, stored = pool.landed_now()
        # each tenant's bytes, refusals and evictions, every process's (.pool_tenants)
        tenants = pool.tenancy.figures(db) if pool.tenancy.active else {}
        return (used, inflight, stored,
                pool.policy.counts(db, pool.ns, pool.me, landed, stored), tenants)

    try:
        used, inflight, stored, (blocks, own_blocks, own_bytes), tenants = session.read(figures)
    except IndexReplaced:  # counted again in the new index: read that one
        used, inflight, stored, (blocks, own_blocks, own_bytes), tenants = session.read(figures)
    out = {"used_bytes": used - inflight + stored, "blocks": blocks,
           "own_used_bytes": own_bytes, "own_blocks": own_blocks,
           "pool_bytes": used, "pool_inflight_bytes": inflight,
           # the pool's own files, counted in its capacity (.pool_files)
           "pool_files_bytes": pool.measure_files(),
           "pool_evictions": pool.evictor.evicted_blocks, "pool_refused": pool.refused,
           # of those, refused by this tier's tenant's quota (.pool_tenants)
           "refused_quota": pool.refused_quota,
           # damaged indexes this process replaced, and those others replaced (.pool_db)
           "index_rebuilds": session.rebuilds,
           "index_switches": session.switches}
    if pool.capacity is not None:
        out["pool_capacity_bytes"] = out["capacity_bytes"] = pool.capacity
    out.update(tenants)
    out.update(kept_figures(pool))
    return out


def kept_figures(pool: SharedPool) -> dict[str, int]:
    """The bytes of the kept blocks of this tier's tenant, every process's, and the marks
    this process refused (:mod:`.pool_keep`)."""
    def kept(db: sqlite3.Connection) -> int:
        mine = pool.tenancy.namespaces(db, pool.tenancy.tenant, "*")
        return pool.kept.kept_bytes(db, [*mine, pool.ns])

    try:
        kept_bytes = pool.session.read(kept)
    except IndexReplaced:
        kept_bytes = pool.session.read(kept)
    return {"kept_bytes": kept_bytes, "keep_refused": pool.kept.refused}
