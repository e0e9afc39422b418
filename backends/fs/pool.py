"""One capacity, one evictor and a free-space floor for every process sharing a local ``fs`` root.

Without this module each process keeps its own count (:mod:`.capacity`), so
N processes on one directory fill it to N times the capacity.  Here every
process opening a local root with ``capacity`` or ``min_free`` shares one
index, ``<root>/.kvtier-pool.db``: SQLite in WAL mode, one row per block
(namespace, key, size, state, writer, last use), the bytes per namespace and
for the root, and each process's credit.  docs/shared-capacity.md has the
whole design; in short:

- **Room is counted before a file is written.**  A transaction takes room
  for a batch and a credit for the next puts; a put the credit covers takes
  no transaction, only a line in the process's journal (:mod:`.pool_writers`).
  The next transaction, or the flusher thread (:meth:`SharedPool._flush_loop`),
  makes the rows of the writes landed, records the uses of gets, and gives
  back the credit of a process that stopped putting.  Block files, in flight or
  not, never exceed the room counted.
- **One evictor at a time** (:mod:`.pool_evictor`), holding a lease (``pool_lease``); victims, in
  the order of the root's ``eviction`` policy (:mod:`.pool_policy`), are
  marked ``D``, their files deleted, then their rows, each by one
  transaction.  The next holder first settles what a dead process left:
  its ``D`` rows, its credit, and the files its journal names.
- **The floor** (``min_free``) is checked with ``statvfs`` when room is
  taken, less the bytes in flight, and again before a put from the credit.
- **Tenants** (``tenants``, :mod:`.pool_tenants`): each tenant's bytes are
  counted with the room, so its quota holds for every process, room in flight
  included; beyond it, a put evicts its tenant's own blocks, and a full pool
  gives up the blocks of the tenant most beyond its fair share.

On network filesystems SQLite's locks cannot be trusted and a sharer on
another machine cannot be told dead by its pid: there the pool is not used
and a warning says so (:mod:`.mounts`).

This module is the credit, the room taken and the rows made; its parts are
the SQLite session (:mod:`.pool_db`), the evictor and its lease
(:mod:`.pool_evictor`), what a dead process left (:mod:`.pool_dead`), each
writer's journal (:mod:`.pool_writers`), the pool's own files counted in the
capacity (:mod:`.pool_files`), the figures in ``stats()`` (:mod:`.pool_stats`),
the options (:mod:`.pool_options`), and the backend's view of it, one
:class:`~.room.Capacity` (:mod:`.pool_capacity`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

from kvtier.block.namespace import DEFAULT_TENANT
from kvtier.policies.tenancy import TenantRules
from kvtier.spec import BackendError

from .local import LocalStore
from .pool_db import IndexReplaced, IndexSession, wal_limit
from .pool_dead import ROW as _ROW
from .pool_deadlines import prepare as prepare_deadlines
from .pool_evictor import Evictor, Pick
from .pool_files import ALLOWANCE, own_files
from .pool_keep import KeptRows
from .pool_options import DB_NAME, POOL_OPTIONS, parse_min_free
from .pool_policy import PoolPolicy, Row, prepare
from .pool_stats import pool_stats
from .pool_tenants import PoolTenants
from .pool_writers import Journal, alive
from .room import Drop

log = logging.getLogger("kvtier.backends.fs")

__all__ = ["DB_NAME", "POOL_OPTIONS", "SharedPool"]

_POLL_S = 0.005  # a put waiting for room looks again this often
_FLUSH_S = 0.05  # a process that stopped putting flushes (rows, uses, credit) this soon ...
_STALE_S = 0.5  # ... and one putting from its credit at least this often
_CREDIT_MAX = 64 << 20  # the most credit a process takes ahead ...
_CREDIT_SHARE = 16  # ... and at most this fraction of the capacity


class SharedPool:
    """This process's handle on the shared index of one root; thread-safe.

    Two locks: the session's (:mod:`.pool_db`: the connection; held for a whole
    transaction, taken first) and ``_lock`` (this process's credit, writes and uses; held for
    microseconds, so a put served from the credit never waits for SQLite).
    """

    def __init__(self, root: str, ns: str, capacity: int | None, scope: str,
                 min_free: str | None, lease_s: float, eviction: str = "lru",
                 tenants: PoolTenants | None = None) -> None:
        self.root, self.ns, self.capacity = root, ns, capacity
        self.scope = "*" if scope == "pool" else ns
        self.floor = parse_min_free(min_free) if min_free is not None else None
        self.lease_s = lease_s
        self.me = f"{os.getpid()}:{secrets.token_hex(4)}"
        self.files = LocalStore(f"{root}/{ns}")
        self.spare = 0  # credit: bytes counted in the index, not yet given to a write
        self.held = 0  # spare + mine + landed's reservations: this process's in flight
        self.mine: dict[bytes, int] = {}  # keys given credit, being written
        # writes landed, (key, size, reserved): their rows are made by the next flush
        self.landed: list[tuple[bytes, int, int]] = []
        self.used: dict[bytes, int] = {}  # reads since the last flush: key -> when (lru),
        # or how many (s3fifo)
        self.refused = 0
        self.refused_quota = 0  # of those, refused by the tenant's quota
        self._unrecorded = 0  # refusals not yet added to the tenant's in the index
        self._quota_bound = False  # the last round of a put: its tenant's quota bound it
        # the tenants' quotas and shares (.pool_tenants); no rules: the pool's order alone
        self.tenancy = tenants or PoolTenants(TenantRules(), DEFAULT_TENANT)
        self.kept = KeptRows(self.tenancy.rules, self.tenancy.tenant, capacity)  # kvtier_keep
        self.journal = Journal(root, self.me)  # the keys it may be writing (.pool_writers)
        self._last_put = self._flushed = 0.0
        self._lock = threading.Lock()  # the credit's; never held during I/O
        self._evicting = threading.Lock()
        self._eviction = eviction
        self.policy: PoolPolicy
        # the connection (.pool_db): the schema and the one policy of the root (_setup) on
        # every index it uses, this process counted again in a rebuilt one (_rejoin)
        self.wal_charge = wal_limit(capacity)  # the log, counted at its bound
        self.own_files = own_files(root)  # the pool's own files, the root's here (.pool_files)
        self.session = IndexSession(root, self._setup, self._rejoin, self.wal_charge)
        # one evictor at a time, under the lease (.pool_evictor)
        self.evictor = Evictor(self.session, root, self.me, self.scope, lease_s, self._add,
                               lambda db: self._flush(db, spare=False), lambda: self.policy)
        if self.tenancy.active:
            self.evictor.counted = self.tenancy.evicted
        self._closing = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                         name="kvtier-fs-pool")
        self._flusher.start()

    # transactions ------------------------------------------------------------
    @contextlib.contextmanager
    def _txn(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (:class:`~.pool_db.IndexSession`)."""
        with self.session.txn() as db:
            yield db

    def _setup(self, db: sqlite3.Connection) -> None:
        self.policy = prepare(db, self._eviction, self.root, self.ns, self.capacity,
                              self.scope, self.me)
        self.tenancy.prepare(db, self.root, self.ns, self.me)
        prepare_deadlines(db)  # kvtier_expire (.pool_deadlines)

    def _rejoin(self, db: sqlite3.Connection) -> None:
        """This process in an index rebuilt from the files (by it or another process): the
        room it holds in flight counted again, and the files of its namespace, as at an
        open; its writes landed get their rows at its next flush."""
        with self._lock:
            held = self.held
        if held:
            self._add(db, self.ns, held, held)
        self._record_held(db)
        entries, _ = self.files.scan(lambda fn, items: [fn(item) for item in items])
        self._adopt_rows(db, {entry.key: entry.size for entry in entries}, self.files)

    @staticmethod
    def _add(db: sqlite3.Connection, ns: str, size: int, inflight: int) -> None:
        db.execute("UPDATE totals SET bytes = bytes + ?, inflight = inflight + ? "
                   "WHERE scope IN (?, '*')", (size, inflight, ns))

    # open and close ------------------------------------------------------------
    def adopt(self, found: Mapping[bytes, int], store: LocalStore) -> None:
        """Count the files found at open that the index lacks; drop rows whose file is gone.

        Each is checked on disk inside the transaction.  A file no row names is
        counted even if it is a write from another process's credit that has
        not made its row yet: that process then finds the row and gives back
        its credit, so the file is counted once.
        """
        try:
            with self._txn() as db:
                self._adopt_rows(db, found, store)
        except IndexReplaced:  # the files were counted again in the new index
            pass

    def _adopt_rows(self, db: sqlite3.Connection, found: Mapping[bytes, int],
                    store: LocalStore) -> None:
        now = time.time_ns() - len(found)
        if self.tenancy.active and found:  # whose the files are, from their headers
            self.tenancy.learn(db, self.ns, store, list(found))
        rows = dict(db.execute("SELECT key, state FROM blocks WHERE ns = ?", (self.ns,)))
        for pos, key in enumerate(found):
            if key not in rows and (size := store.size(key)) is not None:
                db.execute(f"INSERT INTO blocks{_ROW} VALUES (?, ?, ?, 'S', ?, ?)",
                           (self.ns, key, size, self.me, now + pos))
                self._add(db, self.ns, size, 0)
        for key, state in rows.items():
            if state == "S" and key not in found and store.size(key) is None:
                size = db.execute("DELETE FROM blocks WHERE ns = ? AND key = ? "
                                  "RETURNING size", (self.ns, key)).fetchall()[0][0]
                self._add(db, self.ns, -size, 0)

    def alone(self) -> bool:
        """Whether no other live process holds this namespace open: then this one writes
        the namespace's ``index.kvi`` at close, so that one snapshot is written at a
        time, whatever the number of writers (its bytes beside the capacity until
        room is next taken, docs/shared-capacity.md); a fault of the index: no."""
        def others(db: sqlite3.Connection) -> list[str]:
            return [writer for (writer,) in db.execute(
                "SELECT writer FROM writers WHERE ns = ? AND writer != ?", (self.ns, self.me))
                if alive(writer)]

        try:
            return not self.session.read(others)
        except (BackendError, sqlite3.Error, OSError):
            return False

    def count_again(self, key: bytes, size: int) -> None:
        """Count ``key``'s file again, as a file found at open (:meth:`adopt`): an explicit
        evict took its row, and could not delete it."""
        with self._txn() as db:
            if db.execute(f"INSERT OR IGNORE INTO blocks{_ROW} VALUES (?, ?, ?, 'S', ?, ?)",
                          (self.ns, key, size, self.me, time.time_ns())).rowcount:
                self._add(db, self.ns, size, 0)

    def close(self) -> None:
        """Give back what this process holds; an index that fails now costs the others
        at most this process's credit until an evictor settles it (as for a process
        that died), never an error."""
        self._closing.set()
        self._flusher.join()
        try:
            for _ in range(2):  # once more in an index that replaced a damaged one
                try:
                    self._leave()
                    break
                except IndexReplaced:
                    continue
        except OSError as exc:
            log.warning("fs pool %s: closed without giving back its room (%s); another "
                        "process's evictor settles it", self.root, exc)
            return self.session.close()  # the journal stays, for that evictor
        try:
            self.journal.remove()
        finally:
            self.session.close()

    def _leave(self) -> None:
        with self._txn() as db:
            self._flush(db, spare=True)
            with self._lock:
                left, self.mine = sum(self.mine.values()), {}  # never settled: none landed
                self.held -= left
            if left:
                self._add(db, self.ns, -left, -left)
            db.execute("DELETE FROM writers WHERE writer = ?", (self.me,))

    # the data path ------------------------------------------------------------
    def reserve(self, keys: Sequence[bytes], sizes: Sequence[int], drop: Drop) -> list[str]:
        """Take room for ``keys``: per block ``new`` (reserved: write it), ``have`` (being
        written by this process: nothing to write), ``no`` (refused) or ``pushed``
        (made way for a later block of the batch: stored and evicted at once).

        A batch the credit covers takes no transaction; otherwise one takes room
        for it and a new credit, evicting through ``drop`` (which deletes the
        files it is given) under the lease, waiting for the lease or for writes
        in flight at most :attr:`lease_s`.  The keys granted are journaled.
        """
        out = ["no"] * len(keys)
        self._last_put = time.monotonic()
        with self._lock:
            fast = self._from_credit(keys, sizes, out)
        if fast:
            self._log(keys, out)
            return out
        pending = list(range(len(keys)))
        deadline = time.monotonic() + self.lease_s
        replaced = 0
        while True:
            try:
                pending, go_on = self._make_way(keys, sizes, pending, out, drop, deadline)
            except IndexReplaced:
                # a damaged index was replaced during a transaction: what this process
                # granted itself is counted in the new one (_rejoin); the rest is asked again
                replaced += 1
                pending = [i for i in pending if out[i] == "no"]
                go_on = replaced <= 2
            if not (go_on and pending):
                break
        with self._lock:
            self.refused += len(pending)
            self.refused_quota += len(pending) if self._quota_bound else 0
            self._unrecorded += len(pending)  # per tenant, in the index at the next flush
        self._log(keys, out)
        return out

    def _make_way(self, keys: Sequence[bytes], sizes: Sequence[int], pending: list[int],
                  out: list[str], drop: Drop, deadline: float) -> tuple[list[int], bool]:
        """One round of :meth:`reserve`: grant what fits, or evict, or wait for room.
        Answers the blocks still pending, and whether to go on."""
        pending, need, own, waiting = self._grant(keys, sizes, pending, out)
        if not pending:
            return pending, False
        # beyond the tenant's quota alone: only its own blocks, or its writes landing, help
        self._quota_bound = own > 0 and need <= 0
        pick = self._tenants_pick(own, need, sum(sizes[i] for i in pending))
        need = max(need, own)
        freed, tried, kept = 0, False, 0
        # one evicting thread per process: the lease is the process's
        if need > 0 and self._evicting.acquire(blocking=False):
            try:
                if self.evictor.take_lease():
                    tried, (freed, kept) = True, self.evictor.evict(need, drop, pick)
                    waiting = waiting or kept > 0  # others go first on the next round
                else:  # another process evicts: it may have freed room by the next look
                    waiting = True
            finally:
                self._evicting.release()
        elif need > 0:
            waiting = True  # another thread of this process is evicting
        if freed <= 0 and tried and "new" in out:
            # nothing older is left: this batch's first blocks make way for its
            # later ones, as if it were put one block at a time
            self._push_out(keys, out)
            return pending, True
        if freed <= 0:
            held, busy = self.session.read(self.evictor.lease_and_inflight)
            # asked again: others may have taken the room since the grant; the tenant's
            # in flight (from the grant) if its quota alone bounds it
            waiting = waiting or (busy and not self._quota_bound)
            if not (waiting or held) or time.monotonic() > deadline:
                return pending, False  # nothing to evict and nothing landing: it cannot fit
            time.sleep(_POLL_S)
        return pending, True

    def _tenants_pick(self, own: int, need: int, want: int) -> Pick | None:
        """The tenants' choice of victims (:mod:`.pool_tenants`): ``own`` bytes of the
        writer's tenant beyond its quota, ``need`` of the scope by fair share; None:
        the pool's order alone (no tenants, or no capacity and no quota exceeded)."""
        if not self.tenancy.active or (own <= 0 and self.capacity is None):
            return None
        tenancy, ns, capacity, scope = self.tenancy, self.ns, self.capacity, self.scope

        def pick(db: sqlite3.Connection, policy: PoolPolicy) -> list[Row]:
            return tenancy.pick(db, policy, ns, capacity, scope, own, need, want)

        return pick

    def _from_credit(self, keys: Sequence[bytes], sizes: Sequence[int], out: list[str]) -> bool:
        """Grant the whole batch from the credit (``_lock`` held), or nothing."""
        want = sum(size for key, size in zip(keys, sizes, strict=True) if key not in self.mine)
        if want > self.spare:
            return False
        # the floor was checked when the credit was taken; another program may have
        # filled the disk since: then the transaction checks again
        if self.floor is not None and self._above_floor() < self.spare:
            return False
        for i, key in enumerate(keys):
            if key in self.mine:
                out[i] = "have"
            else:
                self.mine[key] = sizes[i]
                out[i] = "new"
        self.spare -= want
        return True

    def _log(self, keys: Sequence[bytes], out: list[str]) -> None:
        """Append the keys granted to the journal, before their files are written: if
        this process dies, the evictor counts the files it finds of them."""
        granted = [key for key, verdict in zip(keys, out, strict=True) if verdict == "new"]
        if granted:
            with self._lock:
                self.journal.append(granted)

    def measure_files(self) -> int:
        """The bytes of the pool's own files, listed at most a second ago (:mod:`.pool_files`)."""
        return self.own_files.measure(self.session.wal, self.wal_charge)

    def _room(self, db: sqlite3.Connection,
              own: int) -> tuple[int | None, int | None, int]:
        """Bytes the capacity and the floor leave, and the bytes in flight in the scope.
        The capacity holds the pool's own files (``own`` bytes) too, beyond their
        allowance (.pool_files); each namespace's capacity counts all of them."""
        used, inflight = db.execute("SELECT bytes, inflight FROM totals WHERE scope = ?",
                                    (self.scope,)).fetchall()[0]
        own = max(0, own - ALLOWANCE)
        cap = None if self.capacity is None else self.capacity - own - used
        floor = None
        if self.floor is not None:
            total_inflight = db.execute(
                "SELECT inflight FROM totals WHERE scope = '*'").fetchall()[0][0]
            floor = self._above_floor() - total_inflight
        return cap, floor, inflight

    def _above_floor(self) -> int:
        """Bytes free on the filesystem beyond ``min_free`` now (``floor`` set)."""
        assert self.floor is not None
        st = os.statvfs(self.root)
        want = self.floor[0] or int(self.floor[1] * st.f_blocks * st.f_frsize)
        return st.f_bavail * st.f_frsize - want

    def _grant(self, keys: Sequence[bytes], sizes: Sequence[int], pending: list[int],
               out: list[str]) -> tuple[list[int], int, int, bool]:
        """Grant what fits; answer the blocks left, the bytes to evict in the scope and
        beyond the tenant's quota, and whether writes in flight may make room."""
        left: list[int] = []
        taken = over = 0
        own = self.measure_files()  # outside the transaction: it holds every writer up
        with self._txn() as db:
            self._flush(db, spare=True)
            cap, floor, inflight = self._room(db, own)
            quota, room, flying = self.tenancy.room(db, self.ns)  # .pool_tenants
            qroom = None if quota is None else room
            with self._lock:
                for i in pending:
                    key, size = keys[i], sizes[i]
                    if key in self.mine:
                        out[i] = "have"
                    elif self.capacity is not None and size > self.capacity:
                        continue  # can never fit
                    elif quota is not None and size > quota:
                        over += 1  # larger than its tenant's quota: refused, counted
                    elif all(r is None or size <= r for r in (cap, floor, qroom)):
                        self.mine[key] = size
                        out[i] = "new"
                        taken += size
                        cap = None if cap is None else cap - size
                        floor = None if floor is None else floor - size
                        qroom = None if qroom is None else qroom - size
                    else:
                        left.append(i)
                self.refused += over
                self.refused_quota += over
                self._unrecorded += over
                if not left and taken:
                    # credit for the next puts, in whole batches of this one's size, from
                    # at most half the room left: a put that evicts is not starved by it
                    limit = _CREDIT_MAX if self.capacity is None else min(
                        _CREDIT_MAX, self.capacity // _CREDIT_SHARE)
                    for left_of in (cap, floor, qroom):
                        limit = limit if left_of is None else min(limit, left_of // 2)
                    self.spare += limit // taken * taken
                    taken += limit // taken * taken
                self.held += taken
            if taken:
                self._add(db, self.ns, taken, taken)
                self._record_held(db)
        want = sum(sizes[i] for i in left)
        need = max(0 if cap is None else want - cap, 0 if floor is None else want - floor)
        beyond = 0 if qroom is None else max(0, want - qroom)
        if beyond > 0 and need <= 0:  # its quota alone: its own writes in flight may land
            with self._lock:
                return left, need, beyond, flying - self.held > 0
        return left, need, beyond, inflight > 0

    def _record_held(self, db: sqlite3.Connection) -> None:
        with self._lock:
            held = self.held
        db.execute("INSERT OR REPLACE INTO writers VALUES (?, ?, ?)", (self.me, self.ns, held))

    def settle(self, key: bytes, size: int | None) -> None:
        """The write of ``key`` reserved here landed (``size`` bytes) or failed (None)."""
        with self._lock:
            reserved = self.mine.pop(key, None)
            if reserved is None:
                return
            if size is not None:
                self.landed.append((key, size, reserved))
            else:
                self.spare += reserved  # given back at the next flush

    def _flush(self, db: sqlite3.Connection, spare: bool) -> None:
        """Make the rows of the writes landed, record the uses, and give back the credit
        if ``spare`` (in a transaction; ``_lock`` only to take and give back the lists,
        so that puts from the credit and landing writes do not wait for the rows)."""
        with self._lock:
            self._flushed = time.monotonic()
            landed, self.landed = self.landed, []
            used, self.used = self.used, {}
            give = self.spare if spare else 0
            self.spare -= give
            refused, self._unrecorded = self._unrecorded, 0
        try:
            grown, flying, wait = self._make_rows(db, landed, used)
            if refused and self.tenancy.active:  # the tenant's refusals, for every process
                self.tenancy.count(db, "refused", {self.tenancy.tenant_of(db, self.ns): refused})
        except BaseException:
            with self._lock:  # rolled back: all of it waits for the next transaction
                self.landed[:0] = landed
                self.used = self.policy.merge(used, self.used)
                self.spare += give
                self._unrecorded += refused
            raise
        with self._lock:
            self.landed[:0] = wait
            released = sum(reserved for *_, reserved in landed) - sum(r for *_, r in wait)
            self.held -= released + give
            if not self.mine and not self.landed:
                self.journal.settled()  # every key it lists has its row now
        if grown or flying or give:
            self._add(db, self.ns, grown - give, flying - give)
            self._record_held(db)

    def _make_rows(self, db: sqlite3.Connection, landed: list[tuple[bytes, int, int]],
                   used: dict[bytes, int]) -> tuple[int, int, list[tuple[bytes, int, int]]]:
        """The rows of ``landed``, the uses ``used``; answer the change to the totals
        (bytes, in flight) and the writes whose row an evictor is deleting."""
        grown = flying = 0
        now = time.time_ns()
        wait, made = [], []
        for key, wrote, reserved in landed:
            size = self.files.size(key)  # None: deleted since by an explicit evict
            if size is not None and db.execute(
                    f"INSERT OR IGNORE INTO blocks{_ROW} VALUES (?, ?, ?, 'S', ?, ?)",
                    (self.ns, key, size, self.me, now)).rowcount:
                grown, flying = grown + size - reserved, flying - reserved
                made.append(key)
                continue
            state = size is not None and db.execute(
                "SELECT state FROM blocks WHERE ns = ? AND key = ?", (self.ns, key)).fetchall()
            if state and state[0][0] == "D":
                wait.append((key, wrote, reserved))  # an evictor deletes it: count it after
            else:  # stored by another process already, or gone
                grown, flying = grown - reserved, flying - reserved
        self.policy.admitted(db, self.ns, made)
        if used:
            self.policy.record_uses(db, self.ns, used)
        return grown, flying, wait

    def _flush_loop(self) -> None:
        """The rows of landed writes, the uses, and the credit of a process that stopped
        putting, so that others can evict and use them: :data:`_FLUSH_S` after its last
        put.  While it puts, its transactions for credit flush, and this thread only
        if they are over :data:`_STALE_S` apart (a transaction less is a change less
        that the other processes' connections read back)."""
        while not self._closing.wait(_FLUSH_S):
            now = time.monotonic()
            idle = now - self._last_put > _FLUSH_S
            with self._lock:
                due = bool(self.landed or self.used or (idle and self.spare)
                           or (self._unrecorded and self.tenancy.active))
            if due and (idle or now - self._flushed > _STALE_S):
                try:
                    with self._txn() as db:
                        self._flush(db, spare=idle)
                except IndexReplaced:
                    pass  # logged by the session; this process is counted in the new index
                except (sqlite3.Error, OSError) as exc:  # tried again in the next round
                    log.warning("fs pool %s: flush failed: %s", self.root, exc)

    def _push_out(self, keys: Sequence[bytes], out: list[str]) -> None:
        i = out.index("new")
        out[i] = "pushed"
        self.settle(keys[i], None)

    def touch(self, keys: Sequence[bytes]) -> None:
        """A read of ``keys``, by any process, counts as a use: recorded by the next
        transaction of this process (:meth:`_flush_loop`)."""
        now = time.time_ns()
        with self._lock:
            self.policy.touch(self.used, keys, now)

    def forget(self, keys: Sequence[bytes]) -> None:
        """``keys`` are about to be deleted by the caller (an explicit evict)."""
        try:
            self._forget(keys)
        except IndexReplaced:
            self._forget(keys)  # in the new index, which counted the files found

    def _forget(self, keys: Sequence[bytes]) -> None:
        with self._txn() as db:
            self._flush(db, spare=False)
            for key in keys:
                row = db.execute("DELETE FROM blocks WHERE ns = ? AND key = ? AND state = 'S' "
                                 "RETURNING size", (self.ns, key)).fetchall()
                if row:
                    self._add(db, self.ns, -row[0][0], 0)
                self.kept.forget(db, self.ns, key)

    def keep(self, keys: Sequence[bytes], keep: bool) -> list[bool | None]:
        """Mark ``keys`` kept, or release them, for every process (:mod:`.pool_keep`)."""
        try:
            return self._keep(keys, keep)
        except IndexReplaced:
            return self._keep(keys, keep)  # in the new index, as forget

    def _keep(self, keys: Sequence[bytes], keep: bool) -> list[bool | None]:
        with self._txn() as db:
            self._flush(db, spare=False)  # the writes landed get rows to mark
            mine = self.tenancy.namespaces(db, self.tenancy.tenant, "*")
            return self.kept.mark(db, self.ns, mine, keys, keep)

    def stats(self) -> dict[str, int]:
        """The scope's truth, beside this process's own share (:mod:`.pool_stats`)."""
        return pool_stats(self)

    def landed_now(self) -> tuple[int, int]:
        """How many of this process's writes landed have no row yet, and their bytes."""
        with self._lock:
            return len(self.landed), sum(size for _, size, _ in self.landed)
