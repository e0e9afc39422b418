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
  no transaction, only a line in the process's journal (:mod:`.sharing`).
  The next transaction, or the flusher thread (:meth:`SharedPool._flush_loop`),
  makes the rows of the writes landed, records the uses of gets, and gives
  back the credit of a process that stopped putting.  Block files, in flight or
  not, never exceed the room counted.
- **One evictor at a time**, holding a lease (``pool_lease``); victims, in
  the order of the root's ``eviction`` policy (:mod:`.pool_policy`), are
  marked ``D``, their files deleted, then their rows, each by one
  transaction.  The next holder first settles what a dead process left:
  its ``D`` rows, its credit, and the files its journal names.
- **The floor** (``min_free``) is checked with ``statvfs`` when room is
  taken, less the bytes in flight, and again before a put from the credit.

On network filesystems SQLite's locks cannot be trusted and a sharer on
another machine cannot be told dead by its pid: there the pool is not used
and a warning says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .local import LocalStore
from .pool_db import IndexReplaced, IndexSession
from .pool_dead import ROW as _ROW
from .pool_dead import settle_dead
from .pool_policy import PoolPolicy, prepare
from .pool_store import PoolStore
from .sharing import DB_NAME, POOL_OPTIONS, alive, journal_path, network_fs, parse_min_free

log = logging.getLogger("kvtier.backends.fs")

__all__ = ["DB_NAME", "POOL_OPTIONS", "PoolStore", "SharedPool", "attach", "network_fs"]

_POLL_S = 0.005  # a put waiting for room looks again this often
_FLUSH_S = 0.05  # a process that stopped putting flushes (rows, uses, credit) this soon ...
_STALE_S = 0.5  # ... and one putting from its credit at least this often
_CREDIT_MAX = 64 << 20  # the most credit a process takes ahead ...
_CREDIT_SHARE = 16  # ... and at most this fraction of the capacity
_JOURNAL_MAX = 1 << 16  # a process's journal is emptied once it is longer


#: Deletes the victims' files; answers, per victim, whether its file is gone.
Drop = Callable[[list[tuple[str, bytes]]], list[bool]]


class SharedPool:
    """This process's handle on the shared index of one root; thread-safe.

    Two locks: the session's (:mod:`.pool_db`: the connection; held for a whole
    transaction, taken first) and ``_lock`` (this process's credit, writes and uses; held for
    microseconds, so a put served from the credit never waits for SQLite).
    """

    def __init__(self, root: str, ns: str, capacity: int | None, scope: str,
                 min_free: str | None, lease_s: float, eviction: str = "lru") -> None:
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
        self.evicted_blocks = self.refused = 0
        self._journal = journal_path(root, self.me)
        self._journal_fd = -1
        self._journaled = 0  # bytes appended since the journal was last emptied
        self._last_put = self._flushed = 0.0
        self._lock = threading.Lock()  # the credit's; never held during I/O
        self._evicting = threading.Lock()
        self._eviction = eviction
        self.policy: PoolPolicy
        # the connection (.pool_db): the schema and the one policy of the root (_setup) on
        # every index it uses, this process counted again in a rebuilt one (_rejoin)
        self._session = IndexSession(root, self._setup, self._rejoin)
        self._closing = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                         name="kvtier-fs-pool")
        self._flusher.start()

    # transactions ------------------------------------------------------------
    @contextlib.contextmanager
    def _txn(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (:class:`~.pool_db.IndexSession`)."""
        with self._session.txn() as db:
            yield db

    def _setup(self, db: sqlite3.Connection) -> None:
        self.policy = prepare(db, self._eviction, self.root, self.ns, self.capacity,
                              self.scope, self.me)

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
            return self._session.close()  # the journal stays, for that evictor
        try:
            if self._journal_fd >= 0:
                os.close(self._journal_fd)
                self._journal_fd = -1
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._journal)
        finally:
            self._session.close()

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
        self._log(keys, out)
        return out

    def _make_way(self, keys: Sequence[bytes], sizes: Sequence[int], pending: list[int],
                  out: list[str], drop: Drop, deadline: float) -> tuple[list[int], bool]:
        """One round of :meth:`reserve`: grant what fits, or evict, or wait for room.
        Answers the blocks still pending, and whether to go on."""
        pending, need, waiting = self._grant(keys, sizes, pending, out)
        if not pending:
            return pending, False
        freed, tried, kept = 0, False, 0
        # one evicting thread per process: the lease is the process's
        if need > 0 and self._evicting.acquire(blocking=False):
            try:
                if self._take_lease():
                    tried, (freed, kept) = True, self._evict(need, drop)
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
            held, busy = self._session.read(self._lease_and_inflight)
            # asked again: others may have taken the room since the grant
            waiting = waiting or busy
            if not (waiting or held) or time.monotonic() > deadline:
                return pending, False  # nothing to evict and nothing landing: it cannot fit
            time.sleep(_POLL_S)
        return pending, True

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
        lines = b"".join(key.hex().encode() + b"\n"
                         for key, verdict in zip(keys, out, strict=True) if verdict == "new")
        if not lines:
            return
        with self._lock:
            if self._journal_fd < 0:
                self._journal_fd = os.open(self._journal, os.O_WRONLY | os.O_CREAT
                                           | os.O_APPEND | os.O_CLOEXEC, 0o644)
            self._journaled += len(lines)
            os.write(self._journal_fd, lines)  # one O_APPEND write of a few lines

    def _room(self, db: sqlite3.Connection) -> tuple[int | None, int | None, int]:
        """Bytes the capacity and the floor leave, and the bytes in flight in the scope."""
        used, inflight = db.execute("SELECT bytes, inflight FROM totals WHERE scope = ?",
                                    (self.scope,)).fetchall()[0]
        cap = None if self.capacity is None else self.capacity - used
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
               out: list[str]) -> tuple[list[int], int, bool]:
        left: list[int] = []
        taken = 0
        with self._txn() as db:
            self._flush(db, spare=True)
            cap, floor, inflight = self._room(db)
            with self._lock:
                for i in pending:
                    key, size = keys[i], sizes[i]
                    if key in self.mine:
                        out[i] = "have"
                    elif self.capacity is not None and size > self.capacity:
                        continue  # can never fit
                    elif (cap is None or size <= cap) and (floor is None or size <= floor):
                        self.mine[key] = size
                        out[i] = "new"
                        taken += size
                        cap = None if cap is None else cap - size
                        floor = None if floor is None else floor - size
                    else:
                        left.append(i)
                if not left and taken:
                    # credit for the next puts, in whole batches of this one's size, from
                    # at most half the room left: a put that evicts is not starved by it
                    limit = _CREDIT_MAX if self.capacity is None else min(
                        _CREDIT_MAX, self.capacity // _CREDIT_SHARE)
                    for room in (cap, floor):
                        limit = limit if room is None else min(limit, room // 2)
                    self.spare += limit // taken * taken
                    taken += limit // taken * taken
                self.held += taken
            if taken:
                self._add(db, self.ns, taken, taken)
                self._record_held(db)
        want = sum(sizes[i] for i in left)
        need = max(0 if cap is None else want - cap, 0 if floor is None else want - floor)
        return left, need, inflight > 0

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
        try:
            grown, flying, wait = self._make_rows(db, landed, used)
        except BaseException:
            with self._lock:  # rolled back: all of it waits for the next transaction
                self.landed[:0] = landed
                self.used = self.policy.merge(used, self.used)
                self.spare += give
            raise
        with self._lock:
            self.landed[:0] = wait
            released = sum(reserved for *_, reserved in landed) - sum(r for *_, r in wait)
            self.held -= released + give
            if self._journaled > _JOURNAL_MAX and not self.mine and not self.landed:
                # every key it lists has its row now: empty it, so it stays short (rarely:
                # an index file that shrinks and grows at once is harder to account for)
                os.ftruncate(self._journal_fd, 0)
                self._journaled = 0
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
                due = bool(self.landed or self.used or (idle and self.spare))
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

    # the evictor ------------------------------------------------------------------
    def _lease_held(self, db: sqlite3.Connection) -> bool:
        """Whether another process holds a live lease (so room may come); in a session's
        transaction or read."""
        holder, expires = db.execute("SELECT holder, expires FROM lease").fetchall()[0]
        return bool(holder != self.me and expires > time.time() and alive(holder))

    def _lease_and_inflight(self, db: sqlite3.Connection) -> tuple[bool, bool]:
        """Whether another process holds the lease, and whether writes are in flight."""
        inflight = db.execute("SELECT inflight FROM totals WHERE scope = ?",
                              (self.scope,)).fetchall()[0][0]
        return self._lease_held(db), inflight > 0

    def _take_lease(self) -> bool:
        with self._txn() as db:
            if self._lease_held(db):
                return False
            db.execute("UPDATE lease SET holder = ?, expires = ?",
                       (self.me, time.time() + self.lease_s))
            return True

    def _evict(self, need: int, drop: Drop) -> tuple[int, int]:
        """Delete the policy's victims in the scope until ``need`` bytes are free;
        answer the bytes freed and the victims that could not be deleted.  Runs with the
        lease held and gives it back."""
        try:
            victims = self._choose(need)
            if not victims:
                return 0, 0
            gone = drop([(ns, key) for ns, key, _ in victims])
            freed = 0
            now = time.time_ns()
            with self._txn() as db:
                for (ns, key, size), ok in zip(victims, gone, strict=True):
                    if not ok:  # kept, and counted; the last in line now, so others go first
                        self.policy.kept(db, ns, key, now)
                    elif db.execute("DELETE FROM blocks WHERE ns = ? AND key = ? AND state = 'D'",
                                  (ns, key)).rowcount:
                        self._add(db, ns, -size, 0)
                        freed += size
            with self._lock:
                self.evicted_blocks += sum(gone)
            return freed, len(gone) - sum(gone)
        finally:
            with self._txn() as db:
                db.execute("UPDATE lease SET expires = 0 WHERE holder = ?", (self.me,))

    def _choose(self, need: int) -> list[tuple[str, bytes, int]]:
        """Mark the victims ``D``: those an evictor that died left, then the scope's in the
        policy's order (:mod:`.pool_policy`) until ``need`` bytes; none if all would not do."""
        with self._txn() as db:
            self._flush(db, spare=False)
            settle_dead(db, self.root, self.me, self._add)  # .pool_dead
            victims = db.execute("SELECT ns, key, size FROM blocks WHERE state = 'D'"
                                 ).fetchall()  # left by an evictor that died
            if self.policy.stored(db, evictable=True) < need and not victims:
                return []  # evicting all would not do: refuse, keep what is stored
            victims += self.policy.choose(db, need)
        return victims

    def stats(self) -> dict[str, int]:
        """The scope's truth from the index (``used_bytes``, ``blocks``), beside this
        process's own share: its count alone kept every block it wrote or found,
        whoever evicted it since, and grew without bound.  Other processes' writes are
        counted once they have their rows, within 50 ms of their last put; the blocks
        and the own share are counted at most once a second (:meth:`.PoolPolicy.counts`)."""
        try:
            used, inflight, stored, (blocks, own_blocks, own_bytes) = self._session.read(
                self._figures)
        except IndexReplaced:  # counted again in the new index: read that one
            used, inflight, stored, (blocks, own_blocks, own_bytes) = self._session.read(
                self._figures)
        out = {"used_bytes": used - inflight + stored, "blocks": blocks,
               "own_used_bytes": own_bytes, "own_blocks": own_blocks,
               "pool_bytes": used, "pool_inflight_bytes": inflight,
               "pool_evictions": self.evicted_blocks, "pool_refused": self.refused,
               # damaged indexes this process replaced, and those others replaced (.pool_db)
               "index_rebuilds": self._session.rebuilds,
               "index_switches": self._session.switches}
        if self.capacity is not None:
            out["pool_capacity_bytes"] = out["capacity_bytes"] = self.capacity
        return out

    def _figures(self, db: sqlite3.Connection) -> tuple[int, int, int, tuple[int, int, int]]:
        """For :meth:`stats`, outside a transaction (no lock of the index; the session's
        held, so no flush runs meanwhile): the scope's bytes and bytes in flight, the
        bytes of this process's writes landed that have no row yet (counted in flight
        until then), and the rows counted (:meth:`.PoolPolicy.counts`)."""
        used, inflight = db.execute("SELECT bytes, inflight FROM totals WHERE scope = ?",
                                    (self.scope,)).fetchall()[0]
        with self._lock:
            landed, stored = len(self.landed), sum(size for _, size, _ in self.landed)
        return used, inflight, stored, self.policy.counts(db, self.ns, self.me, landed, stored)


def attach(store: Any, options: Mapping[str, Any], namespace: str) -> Any:
    """``store`` as a :class:`PoolStore` when its options ask for a shared pool, else as is."""
    wanted = options["capacity"] is not None or options.get("min_free") is not None
    pooled = options.get("capacity_scope") != "process"  # capacity_scope: process, no pool
    if not (isinstance(store, LocalStore) and pooled and wanted):
        return store
    root = os.path.dirname(store.nsroot)
    kind = network_fs(root)
    if kind is not None:
        log.warning("fs tier %s: a %s mount: capacity and min_free hold per process only "
                    "(SQLite's locks are unsafe there)", root, kind)
        return store
    os.makedirs(store.nsroot, exist_ok=True)
    pooled = PoolStore(store.nsroot)
    pooled.__dict__.update(store.__dict__)
    pooled.pool = SharedPool(root, namespace, options["capacity"], options["capacity_scope"],
                             options["min_free"], options["pool_lease"],
                             options.get("eviction", "lru"))
    return pooled
