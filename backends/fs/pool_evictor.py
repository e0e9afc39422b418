"""The shared pool's evictor (:mod:`kvtier.backends.fs.pool`): one at a time, holding a lease.

A process that needs room takes the lease (``pool_lease`` long) in a
transaction; the victims, in the order of the root's ``eviction`` policy
(:mod:`.pool_policy`), are marked ``D`` by one transaction, their files deleted
(by the backend, through ``drop``), then their rows by another.  The holder
first settles what a dead process left (:mod:`.pool_dead`): its ``D`` rows, its
credit, and the files its journal names.  The lease is given back at the end;
a holder that died is replaced at once, one alive but stuck once it expires.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable

from .pool_db import IndexSession
from .pool_dead import Add, settle_dead
from .pool_policy import PoolPolicy, Row
from .pool_writers import alive
from .room import Drop

__all__ = ["Evictor", "Pick"]

#: Marks ``D`` the victims to evict, in the evictor's transaction (a tenant's, by the rules
#: of :mod:`.pool_tenants`), instead of the policy's next ``need`` bytes of the scope.
Pick = Callable[[sqlite3.Connection, PoolPolicy], list[Row]]


class Evictor:
    """This process's evictor of one root's pool; thread-safe (the pool lets one thread of
    a process evict at a time)."""

    def __init__(self, session: IndexSession, root: str, me: str, scope: str, lease_s: float,
                 add: Add, flush: Callable[[sqlite3.Connection], None],
                 policy: Callable[[], PoolPolicy]) -> None:
        self.session, self.root, self.me, self.scope = session, root, me, scope
        self.lease_s = lease_s
        self.add = add  # to a namespace's totals and the root's
        self.flush = flush  # the process's landed writes and uses, made rows first
        self.policy = policy  # the root's, for the index in use
        self.evicted_blocks = 0
        #: Told, in the deleting transaction, the namespaces of the victims deleted.
        self.counted: Callable[[sqlite3.Connection, list[str]], None] | None = None
        self._lock = threading.Lock()

    def lease_held(self, db: sqlite3.Connection) -> bool:
        """Whether another process holds a live lease (so room may come); in a session's
        transaction or read."""
        holder, expires = db.execute("SELECT holder, expires FROM lease").fetchall()[0]
        return bool(holder != self.me and expires > time.time() and alive(holder))

    def lease_and_inflight(self, db: sqlite3.Connection) -> tuple[bool, bool]:
        """Whether another process holds the lease, and whether writes are in flight."""
        inflight = db.execute("SELECT inflight FROM totals WHERE scope = ?",
                              (self.scope,)).fetchall()[0][0]
        return self.lease_held(db), inflight > 0

    def take_lease(self) -> bool:
        with self.session.txn() as db:
            if self.lease_held(db):
                return False
            db.execute("UPDATE lease SET holder = ?, expires = ?",
                       (self.me, time.time() + self.lease_s))
            return True

    def evict(self, need: int, drop: Drop, pick: Pick | None = None) -> tuple[int, int]:
        """Delete the policy's victims in the scope until ``need`` bytes are free (or those
        ``pick`` marks, :mod:`.pool_tenants`); answer the bytes freed and the victims that
        could not be deleted.  Runs with the lease held and gives it back."""
        try:
            victims = self._choose(need, pick)
            if not victims:
                return 0, 0
            gone = drop([(ns, key) for ns, key, _ in victims])
            freed = 0
            deleted: list[str] = []  # the namespaces of the victims deleted
            now = time.time_ns()
            with self.session.txn() as db:
                policy = self.policy()
                for (ns, key, size), ok in zip(victims, gone, strict=True):
                    if not ok:  # kept, and counted; the last in line now, so others go first
                        policy.kept(db, ns, key, now)
                    elif db.execute("DELETE FROM blocks WHERE ns = ? AND key = ? AND state = 'D'",
                                    (ns, key)).rowcount:
                        self.add(db, ns, -size, 0)
                        freed += size
                        deleted.append(ns)
                if self.counted is not None:
                    self.counted(db, deleted)
            with self._lock:
                self.evicted_blocks += sum(gone)
            return freed, len(gone) - sum(gone)
        finally:
            with self.session.txn() as db:
                db.execute("UPDATE lease SET expires = 0 WHERE holder = ?", (self.me,))

    def _choose(self, need: int, pick: Pick | None) -> list[tuple[str, bytes, int]]:
        """Mark the victims ``D``: those an evictor that died left, then the scope's in the
        policy's order (:mod:`.pool_policy`) until ``need`` bytes, or those ``pick``
        chooses; none if all would not do."""
        with self.session.txn() as db:
            self.flush(db)
            settle_dead(db, self.root, self.me, self.add)  # .pool_dead
            victims = db.execute("SELECT ns, key, size FROM blocks WHERE state = 'D'"
                                 ).fetchall()  # left by an evictor that died
            policy = self.policy()
            if pick is not None:  # it checks what it can evict itself: one count, not two
                return victims + pick(db, policy)
            if policy.stored(db, evictable=True) < need and not victims:
                return []  # evicting all would not do: refuse, keep what is stored
            victims += policy.choose(db, need)
        return victims
