"""One capacity, one evictor and a free-space floor for every process sharing a local ``fs`` root.

Without this module each process keeps its own count (:mod:`.capacity`), so
N processes on one directory fill it to N times the capacity.  Here every
process opening a local root with ``capacity`` or ``min_free`` shares one
index, ``<root>/.kvtier-pool.db``: SQLite in WAL mode, one row per block
(namespace, key, size, state, writer, last use) and the bytes per namespace
and for the whole root.

- **Room is taken before a file is written.**  A put reserves its blocks'
  bytes in one transaction (state ``W``), writes the files, and marks each
  stored (``S``) or drops its row.  A row exists before its file and goes
  after it, so the bytes on disk never exceed the bytes counted: with every
  process in the pool, block files stay within the capacity, and the only
  overshoot is a file another process made without the pool (a tier with
  ``pool: false``, a copy by hand) until it is found at the next open.
- **One evictor at a time.**  A put that does not fit takes the lease (one
  row: holder, expiry; ``pool_lease``), marks the least recently used
  blocks of the scope ``D`` in one transaction, deletes their files and then
  their rows.  The lease passes to another process once it expires or its
  holder's process is gone; the new holder first finishes what ``D`` rows
  are left.  A row is deleted once (by the transaction whose ``DELETE``
  finds it), so no block is counted off twice.
- **Use counts across processes.**  Every get marks the blocks it asks for
  as used now, whichever process wrote them; the order is close to LRU
  across all sharers (wall-clock nanoseconds, one machine).
- **The floor.**  ``min_free`` (bytes, or a percent of the filesystem) is
  checked with ``statvfs`` at each reservation, less the writes in flight;
  a put that would cross it evicts, and what still cannot fit is refused.

SQLite's locking relies on POSIX locks and shared memory that network
filesystems (NFS, SMB, Lustre, CephFS, ...) do not give reliably, and a
process on another machine cannot be told dead by its pid: on such a mount
the pool is not used, a warning says so, and the capacity holds per process.
Rows ``W`` of a process that died are settled by the next evictor: stored if
the file is there, dropped if not (by pid, so one pid namespace).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvtier.spec import Option

from .local import LocalStore

log = logging.getLogger("kvtier.backends.fs")

__all__ = ["DB_NAME", "POOL_OPTIONS", "PoolStore", "SharedPool", "network_fs"]

DB_NAME = ".kvtier-pool.db"
#: Filesystems whose locking SQLite cannot trust, or whose sharers are on other machines.
NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "ceph", "fuse.ceph", "fuse.cephfs",
    "glusterfs", "fuse.glusterfs", "gpfs", "beegfs", "9p", "fuse.sshfs", "afs", "ocfs2",
    "gfs2", "fuse.s3fs", "fuse.juicefs", "fuse.gcsfuse",
})
_PERCENT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_POLL_S = 0.005  # a put waiting for room looks again this often
_BUSY_S = 30.0  # the longest a transaction waits for another's to end
_SCHEMA = """
CREATE TABLE IF NOT EXISTS blocks(
    ns TEXT NOT NULL, key BLOB NOT NULL, size INTEGER NOT NULL, state TEXT NOT NULL,
    writer TEXT NOT NULL, used INTEGER NOT NULL, PRIMARY KEY (ns, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS blocks_lru ON blocks(state, used);
CREATE INDEX IF NOT EXISTS blocks_ns_lru ON blocks(ns, state, used);
CREATE TABLE IF NOT EXISTS totals(
    scope TEXT PRIMARY KEY, bytes INTEGER NOT NULL, inflight INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS lease(
    id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL, expires REAL NOT NULL);
INSERT OR IGNORE INTO totals VALUES ('*', 0, 0);
INSERT OR IGNORE INTO lease VALUES (1, '', 0);
"""


def _check_min_free(value: str) -> None:
    _parse_min_free(value)


def _parse_min_free(value: str | int) -> tuple[int, float]:
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


POOL_OPTIONS: Mapping[str, Option] = {
    "pool": Option(
        "bool",
        "local roots: capacity and min_free hold for every process sharing the root "
        "together (a shared index, <root>/.kvtier-pool.db); false: per process",
        default=True,
    ),
    "capacity_scope": Option(
        "str",
        "namespace: capacity bounds this tier's namespace; pool: every namespace of the "
        "root together (local roots with pool on)",
        default="namespace",
        choices=("namespace", "pool"),
    ),
    "min_free": Option(
        "str",
        "local roots: keep this much of the filesystem free (4GiB or 10%): puts evict to "
        "stay above it, and are refused when they cannot",
        default=None,
        check=_check_min_free,
    ),
    "pool_lease": Option(
        "duration",
        "how long the evictor's lease lasts: a dead evictor is replaced within it",
        default="10s",
    ),
}


def network_fs(path: str) -> str | None:
    """The type of the network filesystem holding ``path``, or None for a local one."""
    real = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None  # no /proc: nothing to tell
    return kind if kind in NETWORK_FS else None


def _alive(writer: str) -> bool:
    try:
        os.kill(int(writer.split(":", 1)[0]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


#: Deletes the victims' files; answers, per victim, whether its file is gone.
Drop = Callable[[list[tuple[str, bytes]]], list[bool]]


class SharedPool:
    """This process's handle on the shared index of one root; thread-safe."""

    def __init__(self, root: str, ns: str, capacity: int | None, scope: str,
                 min_free: str | None, lease_s: float) -> None:
        self.root, self.ns, self.capacity = root, ns, capacity
        self.scope = "*" if scope == "pool" else ns
        self.floor = _parse_min_free(min_free) if min_free is not None else None
        self.lease_s = lease_s
        self.me = f"{os.getpid()}:{secrets.token_hex(4)}"
        self.mine: dict[bytes, int] = {}  # keys this process reserved, not yet settled
        # writes landed, (key, size, reserved), marked stored at this process's next
        # transaction: a transaction per block would cost more than a 2 MiB write
        self.landed: list[tuple[bytes, int, int]] = []
        self.evicted_blocks = self.refused = 0
        self._lock = threading.Lock()  # the connection's; never held during file I/O
        self._evicting = threading.Lock()
        self._db = sqlite3.connect(os.path.join(root, DB_NAME), timeout=0.1,
                                   isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints
        # the log is checkpointed at 256 pages and cut back to 1 MiB: the index's own
        # bytes, which no capacity counts, stay small beside min_free
        self._db.execute("PRAGMA wal_autocheckpoint=256")
        self._db.execute("PRAGMA journal_size_limit=1048576")
        with self._txn() as db:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute("INSERT OR IGNORE INTO totals VALUES (?, 0, 0)", (ns,))

    # transactions ------------------------------------------------------------
    class _Txn:
        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def __enter__(self) -> sqlite3.Connection:
            # SQLite's own busy handler sleeps 1, 2, 5, 10 ms ... between tries: under
            # four writers that cost more than the writes; a transaction here lasts
            # tens of microseconds, so look again sooner
            delay, deadline = 50e-6, time.monotonic() + _BUSY_S
            while True:
                try:
                    self.db.execute("BEGIN IMMEDIATE")
                    return self.db
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                time.sleep(delay)
                delay = min(delay * 2, 2e-3)

        def __exit__(self, kind: Any, *rest: Any) -> None:
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")

    def _txn(self) -> SharedPool._Txn:
        return SharedPool._Txn(self._db)

    @staticmethod
    def _add(db: sqlite3.Connection, ns: str, size: int, inflight: int) -> None:
        db.execute("UPDATE totals SET bytes = bytes + ?, inflight = inflight + ? "
                   "WHERE scope IN (?, '*')", (size, inflight, ns))

    # open and close ------------------------------------------------------------
    def adopt(self, found: Mapping[bytes, int], store: LocalStore) -> None:
        """Count the files found at open that the index lacks; drop rows whose file is gone.

        Each is checked on disk inside the transaction: a row is made before
        its file and deleted after it, so a file seen while the write lock is
        held and no row names it is a file nobody counts.
        """
        now = time.time_ns() - len(found)
        with self._lock, self._txn() as db:
            rows = dict(db.execute("SELECT key, state FROM blocks WHERE ns = ?", (self.ns,)))
            for pos, key in enumerate(found):
                if key not in rows and (size := store.size(key)) is not None:
                    db.execute("INSERT INTO blocks VALUES (?, ?, ?, 'S', ?, ?)",
                               (self.ns, key, size, self.me, now + pos))
                    self._add(db, self.ns, size, 0)
            for key, state in rows.items():
                if state == "S" and key not in found and store.size(key) is None:
                    size = db.execute("DELETE FROM blocks WHERE ns = ? AND key = ? "
                                      "RETURNING size", (self.ns, key)).fetchall()[0][0]
                    self._add(db, self.ns, -size, 0)

    def close(self) -> None:
        with self._lock:
            try:
                with self._txn() as db:
                    self._mark_landed(db)
            finally:
                self._db.close()

    # the data path ------------------------------------------------------------
    def reserve(self, keys: Sequence[bytes], sizes: Sequence[int], drop: Drop) -> list[str]:
        """Take room for ``keys``: per block ``new`` (reserved: write it), ``have`` (stored
        or being written by someone: nothing to write), ``no`` (refused) or ``pushed``
        (made way for a later block of the batch: stored and evicted at once).

        Evicts through ``drop`` (which deletes the files it is given) while it
        holds the lease; waits for the lease or for writes in flight to land
        at most :attr:`lease_s`.
        """
        out = ["no"] * len(keys)
        pending = list(range(len(keys)))
        deadline = time.monotonic() + self.lease_s
        while True:
            with self._lock:
                pending, need, waiting = self._grant(keys, sizes, pending, out)
            if not pending:
                return out
            freed, tried, kept = 0, False, 0
            # one evicting thread per process: the lease is the process's
            if need > 0 and self._evicting.acquire(blocking=False):
                try:
                    if self._take_lease():
                        tried, (freed, kept) = True, self._evict(need, drop)
                        waiting = waiting or kept > 0  # others go first on the next round
                finally:
                    self._evicting.release()
            elif need > 0:
                waiting = True  # another thread of this process is evicting
            if freed <= 0 and tried and "new" in out:
                # nothing older is left: this batch's first blocks make way for its
                # later ones, as if it were put one block at a time
                self._push_out(keys, out)
                continue
            if freed <= 0:
                with self._lock:
                    held = self._lease_held()
                    # asked again: others may have taken the room since the grant
                    waiting = waiting or self._db.execute(
                        "SELECT inflight FROM totals WHERE scope = ?",
                        (self.scope,)).fetchall()[0][0] > 0
                if not (waiting or held) or time.monotonic() > deadline:
                    break  # nothing to evict and nothing landing: it cannot fit
                time.sleep(_POLL_S)
        with self._lock:
            self.refused += len(pending)
        return out

    def _room(self, db: sqlite3.Connection) -> tuple[int | None, int | None, int]:
        """Bytes the capacity and the floor leave, and the bytes in flight in the scope."""
        used, inflight = db.execute("SELECT bytes, inflight FROM totals WHERE scope = ?",
                                    (self.scope,)).fetchall()[0]
        cap = None if self.capacity is None else self.capacity - used
        floor = None
        if self.floor is not None:
            st = os.statvfs(self.root)
            total_inflight = db.execute(
                "SELECT inflight FROM totals WHERE scope = '*'").fetchall()[0][0]
            want = self.floor[0] or int(self.floor[1] * st.f_blocks * st.f_frsize)
            floor = st.f_bavail * st.f_frsize - total_inflight - want
        return cap, floor, inflight

    def _grant(self, keys: Sequence[bytes], sizes: Sequence[int], pending: list[int],
               out: list[str]) -> tuple[list[int], int, bool]:
        left: list[int] = []
        now = time.time_ns()
        with self._txn() as db:
            grown, flying = self._mark_landed(db, apply=False)
            cap, floor, inflight = self._room(db)
            for i in pending:
                key, size = keys[i], sizes[i]
                if self.capacity is not None and size > self.capacity:
                    continue  # can never fit
                fits = (cap is None or size <= cap) and (floor is None or size <= floor)
                # the usual case is one statement: the insert, refused for a known key
                if fits and db.execute("INSERT OR IGNORE INTO blocks VALUES (?, ?, ?, 'W', ?, ?)",
                                       (self.ns, key, size, self.me, now)).rowcount:
                    grown, flying = grown + size, flying + size
                    self.mine[key] = size
                    out[i] = "new"
                    cap = None if cap is None else cap - size
                    floor = None if floor is None else floor - size
                    continue
                row = db.execute("SELECT state FROM blocks WHERE ns = ? AND key = ?",
                                 (self.ns, key)).fetchall()
                if row:
                    out[i] = "no" if row[0][0] == "D" else "have"
                else:
                    left.append(i)
            if grown or flying:
                self._add(db, self.ns, grown, flying)
        want = sum(sizes[i] for i in left)
        need = max(0 if cap is None else want - cap, 0 if floor is None else want - floor)
        return left, need, inflight > 0

    def settle(self, key: bytes, size: int | None) -> None:
        """The write of ``key`` reserved here landed (``size`` bytes) or failed (None)."""
        with self._lock:
            reserved = self.mine.pop(key, None)
            if reserved is None:
                return
            if size is not None:
                self.landed.append((key, size, reserved))
                return
            with self._txn() as db:
                gone = db.execute("DELETE FROM blocks WHERE ns = ? AND key = ? AND writer = ?",
                                  (self.ns, key, self.me)).rowcount
                if gone:
                    self._add(db, self.ns, -reserved, -reserved)

    def _mark_landed(self, db: sqlite3.Connection, apply: bool = True) -> tuple[int, int]:
        """Mark the writes landed since the last transaction stored (``_lock`` held);
        answer the change to the totals (bytes, in flight), made unless not ``apply``."""
        grown = flying = 0
        if not self.landed:
            return grown, flying
        now = time.time_ns()
        for key, size, reserved in self.landed:
            if db.execute("UPDATE blocks SET state = 'S', size = ?, used = ? "
                          "WHERE ns = ? AND key = ? AND writer = ? AND state = 'W'",
                          (size, now, self.ns, key, self.me)).rowcount:
                grown, flying = grown + size - reserved, flying - reserved
        self.landed.clear()
        if apply and (grown or flying):
            self._add(db, self.ns, grown, flying)
        return grown, flying

    def _push_out(self, keys: Sequence[bytes], out: list[str]) -> None:
        i = out.index("new")
        out[i] = "pushed"
        self.settle(keys[i], None)

    def touch(self, keys: Sequence[bytes]) -> None:
        """A read of ``keys``, by any process, counts as a use."""
        now = time.time_ns()
        with self._lock, self._txn() as db:
            self._mark_landed(db)
            db.executemany("UPDATE blocks SET used = ? WHERE ns = ? AND key = ? AND state = 'S'",
                           [(now, self.ns, key) for key in keys])

    def forget(self, keys: Sequence[bytes]) -> None:
        """``keys`` are about to be deleted by the caller (an explicit evict)."""
        with self._lock, self._txn() as db:
            self._mark_landed(db)
            for key in keys:
                row = db.execute("DELETE FROM blocks WHERE ns = ? AND key = ? AND state = 'S' "
                                 "RETURNING size", (self.ns, key)).fetchall()
                if row:
                    self._add(db, self.ns, -row[0][0], 0)

    # the evictor ------------------------------------------------------------------
    def _lease_held(self) -> bool:
        """Whether another process holds a live lease (so room may come)."""
        holder, expires = self._db.execute("SELECT holder, expires FROM lease").fetchall()[0]
        return holder != self.me and expires > time.time() and _alive(holder)

    def _take_lease(self) -> bool:
        with self._lock, self._txn() as db:
            holder, expires = db.execute("SELECT holder, expires FROM lease").fetchall()[0]
            if holder != self.me and expires > time.time() and _alive(holder):
                return False
            db.execute("UPDATE lease SET holder = ?, expires = ?",
                       (self.me, time.time() + self.lease_s))
            return True

    def _evict(self, need: int, drop: Drop) -> tuple[int, int]:
        """Delete the least recently used blocks of the scope until ``need`` bytes are free;
        answer the bytes freed and the victims that could not be deleted.  Runs with the
        lease held and gives it back."""
        try:
            with self._lock, self._txn() as db:
                self._mark_landed(db)
                self._settle_dead(db)
                victims = db.execute("SELECT ns, key, size FROM blocks WHERE state = 'D'"
                                     ).fetchall()  # left by an evictor that died
                where = "" if self.scope == "*" else "ns = ? AND "
                args: tuple[Any, ...] = () if self.scope == "*" else (self.scope,)
                held = db.execute(f"SELECT COALESCE(SUM(size), 0) FROM blocks WHERE {where}"
                                  "state = 'S'", args).fetchall()[0][0]
                if held < need and not victims:
                    return 0, 0  # evicting all would not do: refuse, keep what is stored
                rows = db.execute(f"SELECT ns, key, size FROM blocks WHERE {where}state = 'S' "
                                  "ORDER BY used", args)
                total = 0
                for ns, key, size in rows:
                    if total >= need:
                        break
                    victims.append((ns, key, size))
                    total += size
                rows.close()  # ends the statement, so that the commit is not held by it
                db.executemany("UPDATE blocks SET state = 'D' WHERE ns = ? AND key = ?",
                               [(ns, key) for ns, key, _ in victims])
            if not victims:
                return 0, 0
            gone = drop([(ns, key) for ns, key, _ in victims])
            freed = 0
            now = time.time_ns()
            with self._lock, self._txn() as db:
                for (ns, key, size), ok in zip(victims, gone, strict=True):
                    if not ok:  # kept, and counted; the most recent now, so others go first
                        db.execute("UPDATE blocks SET state = 'S', used = ? "
                                   "WHERE ns = ? AND key = ? AND state = 'D'", (now, ns, key))
                    elif db.execute("DELETE FROM blocks WHERE ns = ? AND key = ? AND state = 'D'",
                                  (ns, key)).rowcount:
                        self._add(db, ns, -size, 0)
                        freed += size
                self.evicted_blocks += sum(gone)
            return freed, len(gone) - sum(gone)
        finally:
            with self._lock, self._txn() as db:
                db.execute("UPDATE lease SET expires = 0 WHERE holder = ?", (self.me,))

    def _settle_dead(self, db: sqlite3.Connection) -> None:
        """Rows ``W`` of other processes: stored if their file is there (published by a
        rename, so whole: the write landed, its writer has not said so yet), dropped if
        not and their writer is dead (by pid: one pid namespace)."""
        rows = db.execute("SELECT ns, key, size, writer FROM blocks WHERE state = 'W' "
                          "AND writer != ?", (self.me,)).fetchall()
        dead: dict[str, bool] = {}
        for ns, key, size, writer in rows:
            on_disk = LocalStore(f"{self.root}/{ns}").size(key)
            if on_disk is not None:
                db.execute("UPDATE blocks SET state = 'S', size = ? WHERE ns = ? AND key = ?",
                           (on_disk, ns, key))
                self._add(db, ns, on_disk - size, -size)
            elif dead.setdefault(writer, not _alive(writer)):
                db.execute("DELETE FROM blocks WHERE ns = ? AND key = ?", (ns, key))
                self._add(db, ns, -size, -size)

    def stats(self) -> dict[str, int]:
        with self._lock:
            used, inflight = self._db.execute(
                "SELECT bytes, inflight FROM totals WHERE scope = ?", (self.scope,)).fetchall()[0]
        out = {"pool_bytes": used, "pool_inflight_bytes": inflight,
               "pool_evictions": self.evicted_blocks, "pool_refused": self.refused}
        if self.capacity is not None:
            out["pool_capacity_bytes"] = self.capacity
        return out


class PoolStore(LocalStore):
    """A local store whose writes settle the room the pool reserved for them."""

    pool: SharedPool

    def remove_victim(self, victim: tuple[str, bytes]) -> bool:
        """Delete a victim of any namespace of the root: True, its file is gone (also if
        it was already); a fault raises, for the backend's rule on faults."""
        ns, key = victim
        path = self.path(key) if ns == self.pool.ns else LocalStore(
            f"{self.pool.root}/{ns}").path(key)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True

    def write(self, key: bytes, parts: Sequence[Any], fsync: bool) -> int:
        try:
            size = super().write(key, parts, fsync)
        except BaseException:
            self.pool.settle(key, None)
            raise
        self.pool.settle(key, size)
        return size


def attach(store: Any, options: Mapping[str, Any], namespace: str) -> Any:
    """``store`` as a :class:`PoolStore` when its options ask for a shared pool, else as is."""
    wanted = options["capacity"] is not None or options.get("min_free") is not None
    if not (isinstance(store, LocalStore) and options.get("pool", True) and wanted):
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
                             options["min_free"], options["pool_lease"])
    return pooled
