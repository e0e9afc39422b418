"""The shared pool's SQLite session: the connection to ``<root>/.kvtier-pool.db``, its
transactions, and the index's recovery when it is damaged (:class:`IndexSession`), used by
:class:`~kvtier.backends.fs.pool.SharedPool`.

The index is SQLite in WAL mode.  A transaction here lasts tens of
microseconds and holds the write lock only for the index's own statements:
never while block files are written, read or deleted.

The index is a cache of what is on disk, so damage never fails the tier.
Damage is what SQLite says of the file (``database disk image is
malformed``, ``file is not a database``), something other than a file in its
place (a directory), or the file deleted or replaced while processes use it,
seen by its identity (device and inode), which every transaction compares
first.  The process that finds it, holding ``<root>/.kvtier-pool.db.lock``
(``flock``, so that one process rebuilds), moves the damaged file aside to
``<root>/.kvtier-pool.db.damaged`` (replacing the copy moved there before, so
one is kept, with its log as ``.damaged-wal``), creates a new index
``<root>/.kvtier-pool.db.<generation>`` and points ``.kvtier-pool.db`` at it
(a symbolic link, renamed into place).  Its own room in flight and the files
of its namespace are counted again in it, as at a first open.  Every other
process sees the identity change at its next transaction, or meets the
damage itself: under the lock it finds the index already replaced by a sound
one, switches to it and counts itself in again, without rebuilding.

A generation of its own gives each index a log and shared memory of its own
(``<name>-wal``, ``<name>-shm``): the last connection to close an index deletes
those by name, so an index rebuilt under the same name would lose its log to a
late close of the damaged one.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import shutil
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from kvtier.spec import BackendError

from .pool_options import DB_NAME

__all__ = ["DAMAGED", "WAL_MAX", "IndexReplaced", "IndexSession", "wal_limit", "when_unlocked"]

log = logging.getLogger("kvtier.backends.fs")

T = TypeVar("T")

_BUSY_S = 30.0  # the longest a transaction waits for another's to end
#: The log's bound: a transaction that finds it longer checkpoints it to empty first
#: (docs/shared-capacity.md).  SQLite's own checkpoints (every 256 pages) cannot empty
#: it while other connections write: with 8 writers on ext4 it reached 7 MiB.
WAL_MAX = 1 << 20
#: ... and for a small capacity, which counts the log at its bound (:mod:`.pool_files`),
#: an eighth of it, but no less than this: a checkpoint makes every process wait, and a
#: read that meets one (a count for stats) waits too; within the files' allowance.
WAL_MIN = 128 << 10


def wal_limit(capacity: int | None) -> int:
    """The log's bound for a pool of ``capacity`` (None: ``min_free`` alone)."""
    return WAL_MAX if capacity is None else max(WAL_MIN, min(WAL_MAX, capacity // 8))

DAMAGED = DB_NAME + ".damaged"  # the one damaged index kept, for a look
_LOCK = DB_NAME + ".lock"  # held (flock) while the index is created or rebuilt
#: A rebuilt index (``.kvtier-pool.db.<generation>``), its log or its shared memory.
_GENERATION = re.compile(re.escape(DB_NAME) + r"\.[0-9a-f]{8}(-wal|-shm)?")
_CORRUPT, _NOTADB = 11, 26  # SQLite's primary result codes ...
_SHORT_READ = 522  # ... and SQLITE_IOERR_SHORT_READ: a file shorter than it says


class IndexReplaced(BackendError):
    """The index was found damaged during a transaction and replaced: the transaction's
    changes are lost, this process's room in flight is counted in the new index."""


def when_unlocked(statement: Callable[[], object]) -> None:
    """Run ``statement`` once no other connection's lock refuses it (for up to ``_BUSY_S``).

    SQLite's own busy handler sleeps 1, 2, 5, 10 ms ... between tries: under
    four writers that cost more than the writes; a transaction here lasts
    tens of microseconds, so look again sooner.
    """
    delay, deadline = 50e-6, time.monotonic() + _BUSY_S
    while True:
        try:
            statement()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 2e-3)


def connect(path: str, wal_max: int = WAL_MAX) -> sqlite3.Connection:
    """A connection to the index at ``path``, in WAL mode, its log cut back to ``wal_max``."""
    db = sqlite3.connect(path, timeout=0.1, isolation_level=None, check_same_thread=False)
    try:
        # switching a new index to WAL takes its lock: wait for a sharer creating it
        when_unlocked(lambda: db.execute("PRAGMA journal_mode=WAL"))
        db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints
        # the log is checkpointed at 256 pages and cut back to its bound, at which the
        # capacity counts it (.pool_files)
        db.execute("PRAGMA wal_autocheckpoint=256")
        db.execute(f"PRAGMA journal_size_limit={int(wal_max)}")
    except BaseException:
        db.close()
        raise
    return db


def damage(exc: BaseException) -> str | None:
    """What ``exc``, raised by SQLite, says of the index's file; None: not damage (a lock
    held too long, a full disk, an I/O error: faults of the tier)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return None
    code = getattr(exc, "sqlite_errorcode", 0) or 0
    text = str(exc)
    if code & 0xFF in (_CORRUPT, _NOTADB) or "malformed" in text or "not a database" in text:
        return text
    if code == _SHORT_READ:
        return f"{text}: a file of the index is shorter than it says"
    if "no such table" in text:  # replaced by an empty database
        return text
    return None


#: What the pool's code raises on a row the schema always has that is missing (a page
#: lost to truncation reads as empty, without an error of SQLite) or of a wrong type.
_SILENT = (IndexError, TypeError)


def _malformed(exc: BaseException) -> sqlite3.DatabaseError:
    return sqlite3.DatabaseError(
        f"database disk image is malformed: a row is missing or wrong ({exc!r})")


Ident = tuple[int, int]


def _ident(path: str) -> Ident | None:
    """The device and inode of the regular file at ``path`` (a link followed); None: none
    there, or something other than a file."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def _remove(path: str) -> None:
    """Remove what ``path`` names, file, link or directory; nothing there is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class IndexSession:
    """One process's connection to a root's index; thread-safe.

    ``lock`` is held for a whole transaction (and for a read outside one);
    never during file I/O.  ``setup(db)`` (in a transaction) makes the schema on
    every index this session connects to; ``rejoin(db)`` (in a transaction)
    counts this process again in an index that replaced a damaged one.
    """

    def __init__(self, root: str, setup: Callable[[sqlite3.Connection], None],
                 rejoin: Callable[[sqlite3.Connection], None], wal_max: int = WAL_MAX) -> None:
        self.root = root
        self.wal_max = wal_max  # the log's bound (wal_limit)
        self.link = os.path.join(root, DB_NAME)
        self.setup, self.rejoin = setup, rejoin
        self.lock = threading.Lock()
        self.rebuilds = self.switches = 0  # indexes this process rebuilt, or switched to
        self.db: sqlite3.Connection | None = None
        self.ident: Ident | None = None
        self.wal = ""  # the index's log
        self.checkpoints = 0  # logs this process emptied, past wal_max
        with self.lock:
            self._first_open()

    # opening ------------------------------------------------------------------
    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """The root's rebuild lock: one process creates or rebuilds the index at a time."""
        fd = os.open(os.path.join(self.root, _LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _first_open(self) -> None:
        """Connect to the index, creating it if there is none; a damaged one is rebuilt."""
        seen = _ident(self.link)
        if seen is None and not os.path.lexists(self.link):
            with self._exclusive():  # none yet: create it, unless another process just did
                if not os.path.lexists(self.link):
                    # a log left by an index deleted under its processes is no log of a new
                    # one: a connection would read the old pages from it; and the files of
                    # a rebuilt index whose name was deleted are no one's now
                    _remove(self.link + "-wal")
                    _remove(self.link + "-shm")
                    for name in os.listdir(self.root):
                        if _GENERATION.fullmatch(name):
                            _remove(os.path.join(self.root, name))
                seen = _ident(self.link)
                if seen is None and not os.path.lexists(self.link):
                    self._attach(self.link, rejoin=False)
                    return
        try:
            if seen is None:
                raise sqlite3.DatabaseError("not a file")
            self._attach(os.path.realpath(self.link), rejoin=False)
        except sqlite3.Error as exc:
            why = damage(exc) or ("not a file" if _ident(self.link) is None else None)
            if why is None:
                raise self._fault(exc) from exc
            self._recover(why, seen, rejoin=False)

    def _attach(self, path: str, rejoin: bool) -> None:
        """Connect to the index at ``path`` and make it this session's (``lock`` held)."""
        before = _ident(path)
        db = connect(path, self.wal_max)
        try:
            if before is not None:
                # damage a sharer's cache hides, found before this process relies on it
                found = db.execute("PRAGMA quick_check(1)").fetchall()[0][0]
                if found != "ok":
                    raise sqlite3.DatabaseError(f"database disk image is malformed: {found}")
            self._in_txn(db, self.setup)
            if rejoin:
                self._in_txn(db, self.rejoin)
            ident = _ident(path)
            if ident is None or (before is not None and ident != before):
                raise sqlite3.DatabaseError("no such table: replaced while it was opened")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.close()
            raise
        old, self.db, self.ident = self.db, db, ident
        self.wal = path + "-wal"
        if old is not None:
            # its log and shared memory have names of their own (the generations): the
            # close of the last connection deletes none of the new index's
            with contextlib.suppress(sqlite3.Error):
                old.close()

    @staticmethod
    def _in_txn(db: sqlite3.Connection, body: Callable[[sqlite3.Connection], None]) -> None:
        when_unlocked(lambda: db.execute("BEGIN IMMEDIATE"))
        try:
            body(db)
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            if isinstance(exc, _SILENT):
                raise _malformed(exc) from exc
            raise
        db.execute("COMMIT")

    # recovery ------------------------------------------------------------------
    def _recover(self, why: str, seen: Ident | None, rejoin: bool = True) -> None:
        """The index this session used (``seen``) is damaged or gone: switch to the one
        another process rebuilt, or rebuild it (``lock`` held)."""
        with self._exclusive():
            now = _ident(self.link)
            if now is not None and now != seen:
                try:
                    self._attach(os.path.realpath(self.link), rejoin)
                except sqlite3.Error as exc:
                    if damage(exc) is None:
                        raise self._fault(exc) from exc
                    why = damage(exc) or why  # that one is damaged too
                else:
                    self.switches += 1
                    log.info("fs pool %s: the index %s was rebuilt by another process; "
                             "this one uses the new index", self.root, self.link)
                    return
            self._rebuild(why, rejoin)

    def _rebuild(self, why: str, rejoin: bool) -> None:
        """Move the damaged index aside, create a new one, point the name at it (under the
        rebuild lock)."""
        aside = os.path.join(self.root, DAMAGED)
        try:
            _remove(aside)
            _remove(aside + "-wal")
            target = os.path.realpath(self.link)
            if os.path.lexists(target):
                os.rename(target, aside)
            moved = os.path.lexists(aside)
            if os.path.lexists(target + "-wal"):
                os.rename(target + "-wal", aside + "-wal")
            _remove(target + "-shm")  # processes still on it keep their mapping
            fresh = f"{self.link}.{secrets.token_hex(4)}"
            self._attach(fresh, rejoin)
            name = f"{self.link}.tmp-{secrets.token_hex(4)}"
            os.symlink(os.path.basename(fresh), name)
            os.rename(name, self.link)  # the name points at the new index at once
            self.ident = _ident(self.link)
        except (OSError, sqlite3.Error) as exc:
            raise BackendError(
                f"fs pool {self.root}: the index {self.link} is damaged ({why}) and could not "
                f"be rebuilt: {exc}; close every process on the root and delete "
                f"{self.link}*") from exc
        self.rebuilds += 1
        log.warning("fs pool %s: the index %s is damaged (%s): %s, and a new index was "
                    "built from the block files; the pool goes on", self.root, self.link, why,
                    f"moved aside to {aside}" if moved else "nothing left to move aside")

    def _fault(self, exc: sqlite3.Error) -> BackendError:
        """An error of the index that is no damage, as the tier's fault."""
        name = getattr(exc, "sqlite_errorname", "")
        return BackendError(f"fs pool {self.root}: the index {self.link}: {exc}"
                            + (f" ({name})" if name else ""))

    def _failed(self, exc: sqlite3.Error) -> BackendError:
        """The error to raise for ``exc``, met in a transaction (``lock`` held): a damaged
        index is replaced first (:class:`IndexReplaced`)."""
        why = damage(exc)
        if why is None:
            return self._fault(exc)
        self._recover(why, self.ident)
        return IndexReplaced(f"fs pool {self.root}: the index {self.link} was damaged "
                             f"({why}) and replaced")

    def _current(self) -> sqlite3.Connection:
        """The connection, switched first if the index was deleted or replaced (``lock``
        held)."""
        if _ident(self.link) != self.ident:
            self._recover("deleted or replaced while in use", self.ident)
        assert self.db is not None
        return self.db

    # use ------------------------------------------------------------------
    @contextlib.contextmanager
    def txn(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, :attr:`lock` held throughout.  An error of SQLite is a
        :class:`~kvtier.spec.BackendError` naming the index; damage found replaces the
        index first (:class:`IndexReplaced`)."""
        with self.lock:
            db = self._current()
            try:
                when_unlocked(lambda: db.execute("BEGIN IMMEDIATE"))
            except sqlite3.Error as exc:
                if damage(exc) is None:
                    raise self._fault(exc) from exc
                self._recover(damage(exc) or "", self.ident)  # nothing done yet: go on
                db = self._current()
                when_unlocked(lambda: db.execute("BEGIN IMMEDIATE"))
            try:
                if self._wal_bytes() > self.wal_max - self.wal_max // 4:
                    db.execute("ROLLBACK")  # nothing done yet: empty the log first
                    self._checkpoint(db)
                    when_unlocked(lambda: db.execute("BEGIN IMMEDIATE"))
                yield db
                db.execute("COMMIT")
            except (sqlite3.Error, *_SILENT) as exc:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                error = exc if isinstance(exc, sqlite3.Error) else _malformed(exc)
                raise self._failed(error) from exc
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise

    def _wal_bytes(self) -> int:
        try:
            return os.stat(self.wal).st_size
        except FileNotFoundError:
            return 0

    def _checkpoint(self, db: sqlite3.Connection) -> None:
        """Copy the log into the index and cut it to nothing (``lock`` held), once it is
        past three quarters of its bound: the transaction that follows fits in the
        last quarter, and the log stays within the bound at which the capacity
        counts it (a transaction over a quarter of it, such as an open adopting
        thousands of files, is the exception).  Every
        process's transaction waits for this first, so that none adds to the log
        meanwhile: it stays within wal_max and one transaction, whatever the number of
        writers and the speed of the disk."""
        deadline = time.monotonic() + _BUSY_S
        delay = 50e-6
        while True:
            try:
                busy = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0][0]
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc):
                    raise
                busy = 1
            if not busy or self._wal_bytes() <= self.wal_max:  # emptied, here or by another
                self.checkpoints += not busy
                return
            if time.monotonic() > deadline:
                return  # a reader that never ends: the log waits for the next try
            time.sleep(delay)
            delay = min(delay * 2, 2e-3)

    def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """``query`` run on the connection outside a transaction (:attr:`lock` held)."""
        with self.lock:
            db = self._current()
            try:
                return query(db)
            except (sqlite3.Error, *_SILENT) as exc:
                error = exc if isinstance(exc, sqlite3.Error) else _malformed(exc)
                raise self._failed(error) from exc

    def close(self) -> None:
        with self.lock:
            if self.db is not None:
                with contextlib.suppress(sqlite3.Error):
                    self.db.close()
                self.db = None

