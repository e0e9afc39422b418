"""Kept blocks in the shared pool: the index's ``kept`` table, every process's marks.

A row ``(ns, key)`` of ``kept`` marks the block of that row of ``blocks``
kept (``kvtier_keep``).  The pool's victims are chosen in SQL, by every
process, with :data:`NOT_KEPT` among their conditions
(:mod:`.pool_policy`'s ``_KEPT``): a kept block is no victim of the
capacity, of ``min_free`` or of its tenant's quota, whichever process
evicts.  Where only kept blocks could make room, the put is refused, as
where only a tenant within its share could.

Marks are bounded per tenant by its rule's ``keep`` (the retention budget),
the bytes of its kept blocks in every namespace of the root counted from the
index, and all tenants' together by the capacity.  A mark is made by one
transaction that counts and inserts, so two processes marking at once cannot
pass the budget together.

A mark goes with its block: an explicit evict or an expiry deletes the row
(:meth:`KeptRows.forget`, in the pool's ``forget``); a mark whose block left
otherwise (a rebuilt index, a file deleted by hand) counts nothing, as the
budget is summed over the blocks that are there, and is deleted at the next
mark of its namespace.  A rebuilt index starts with no marks: the blocks
there are kept no more (docs/tenants.md, "Retention").  A process of a
version without this table evicts kept blocks: every process on a root
must be of a version that has it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from kvtier.policies.tenancy import TenantRules

__all__ = ["NOT_KEPT", "SCHEMA", "KeptRows"]

SCHEMA = ("CREATE TABLE IF NOT EXISTS kept(ns TEXT NOT NULL, key BLOB NOT NULL, "
          "PRIMARY KEY (ns, key)) WITHOUT ROWID")
#: The condition on a row of ``blocks`` that it is not kept.
NOT_KEPT = "NOT EXISTS (SELECT 1 FROM kept AS k WHERE k.ns = blocks.ns AND k.key = blocks.key)"


class KeptRows:
    """One process's marks in a pool's index, for the tenant of its namespace."""

    def __init__(self, rules: TenantRules, tenant: str, capacity: int | None) -> None:
        quota = rules.quota(tenant)
        budget = rules.rule(tenant).keep
        self.budget = budget if quota is None else min(budget, quota)
        self.capacity = capacity
        self.tenant = tenant
        self.refused = 0  # marks this process refused for the budget (every process's, per
        # tenant, in the index's meta: 'keep_refused:<tenant>', .pool_tenants reports them)

    def mark(self, db: sqlite3.Connection, ns: str, namespaces: Sequence[str],
             keys: Sequence[bytes], keep: bool) -> list[bool | None]:
        """In the caller's transaction: mark ``keys`` of ``ns`` kept or release them;
        ``namespaces`` are the tenant's (its budget counts their marks)."""
        db.execute("DELETE FROM kept WHERE ns = ? AND NOT EXISTS (SELECT 1 FROM blocks AS b "
                   "WHERE b.ns = kept.ns AND b.key = kept.key AND b.state = 'S')", (ns,))
        mine = self._bytes(db, [*namespaces, ns])
        total = self._bytes(db, None)
        refused = 0
        out: list[bool | None] = []
        for key in keys:
            row = db.execute("SELECT size FROM blocks WHERE ns = ? AND key = ? AND state = 'S'",
                             (ns, key)).fetchall()
            if not row:
                out.append(None)
                continue
            marked = bool(db.execute("SELECT 1 FROM kept WHERE ns = ? AND key = ?",
                                     (ns, key)).fetchall())
            if not keep:
                db.execute("DELETE FROM kept WHERE ns = ? AND key = ?", (ns, key))
                out.append(True)
                continue
            size = int(row[0][0])
            if marked:
                out.append(True)
            elif mine + size > self.budget or (self.capacity is not None
                                                and total + size > self.capacity):
                refused += 1
                out.append(False)
            else:
                db.execute("INSERT INTO kept VALUES (?, ?)", (ns, key))
                mine, total = mine + size, total + size
                out.append(True)
        if refused:
            self.refused += refused
            db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (name) "
                       "DO UPDATE SET value = value + excluded.value",
                       (f"keep_refused:{self.tenant}", refused))
        return out

    @staticmethod
    def forget(db: sqlite3.Connection, ns: str, key: bytes) -> None:
        """``key``'s block is being deleted by request (an evict, an expiry): no mark left."""
        db.execute("DELETE FROM kept WHERE ns = ? AND key = ?", (ns, key))

    def kept_bytes(self, db: sqlite3.Connection, namespaces: Sequence[str]) -> int:
        return self._bytes(db, namespaces)

    @staticmethod
    def _bytes(db: sqlite3.Connection, namespaces: Sequence[str] | None) -> int:
        """Bytes of the kept blocks there (of ``namespaces``; None: the root)."""
        where = ""
        args: tuple[str, ...] = ()
        if namespaces is not None:
            unique = tuple(dict.fromkeys(namespaces))
            where, args = f"AND k.ns IN ({', '.join('?' * len(unique))}) ", unique
        return int(db.execute(
            "SELECT COALESCE(SUM(b.size), 0) FROM kept AS k JOIN blocks AS b "
            f"ON b.ns = k.ns AND b.key = k.key WHERE b.state = 'S' {where}",
            args).fetchall()[0][0])
