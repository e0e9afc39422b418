"""The shared pool's per-tenant figures for an ``fs`` tier opened ``read_only``.

``kvtier inspect`` opens a root read-only (:mod:`.readonly`): no pool is
attached, so nothing is written under the root.  Yet the pool's index holds
what only it knows per tenant, every process's: the bytes of the blocks each
tenant keeps marked and the marks refused (:mod:`.pool_keep`), its refusals
and evictions (:mod:`.pool_tenants`).  :class:`PoolView` is this process's own
count, as any read-only tier's, whose ``stats()`` adds those figures, read
from the index by a connection that writes nothing:

- while a process holds the pool open, its log and shared memory are there:
  SQLite's read-only mode reads them, the last transaction included;
- once every process closed it, they are gone (the log checkpointed into the
  index), and a read-only connection would make them again: the index is then
  read as immutable, which it is until a process opens it.

A fault of the index (damaged, of a version without these tables, replaced
while read) gives no figures, never an error.
"""

from __future__ import annotations

import os
import sqlite3

from kvtier.policies.tenancy import TenantRules

from .layout import Store
from .pool_options import DB_NAME
from .pool_tenants import PoolTenants
from .room import ProcessCapacity

__all__ = ["PoolView"]


class PoolView(ProcessCapacity):
    """A read-only tier's own count, and the pool's per-tenant figures of ``root``."""

    def __init__(self, store: Store, limit: int | None, root: str, rules: TenantRules) -> None:
        super().__init__(store, limit)
        self.index = os.path.join(root, DB_NAME)
        self.tenants = PoolTenants(rules, "")

    def stats(self) -> dict[str, int]:
        live = os.path.exists(self.index + "-shm")
        mode = "mode=ro" if live else "immutable=1"
        try:
            db = sqlite3.connect(f"file:{self.index}?{mode}", uri=True, timeout=0.1)
        except sqlite3.Error:
            return {}
        try:
            return self.tenants.figures(db)
        except sqlite3.Error:
            return {}
        finally:
            db.close()
