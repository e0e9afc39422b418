"""The shared pool's SQLite session: the connection to ``<root>/.kvtier-pool.db`` and its
transactions (:class:`IndexSession`), used by :class:`~kvtier.backends.fs.pool.SharedPool`.

The index is SQLite in WAL mode.  A transaction here lasts tens of
microseconds and holds the write lock only for the index's own statements:
never while block files are written, read or deleted.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from .sharing import DB_NAME

__all__ = ["IndexSession", "when_unlocked"]

T = TypeVar("T")

_BUSY_S = 30.0  # the longest a transaction waits for another's to end


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


def connect(path: str) -> sqlite3.Connection:
    """A connection to the index at ``path``, in WAL mode."""
    db = sqlite3.connect(path, timeout=0.1, isolation_level=None, check_same_thread=False)
    try:
        # switching a new index to WAL takes its lock: wait for a sharer creating it
        when_unlocked(lambda: db.execute("PRAGMA journal_mode=WAL"))
        db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints
        # the log is checkpointed at 256 pages and cut back to 1 MiB: the index's own
        # bytes, which no capacity counts, stay small beside min_free
        db.execute("PRAGMA wal_autocheckpoint=256")
        db.execute("PRAGMA journal_size_limit=1048576")
    except BaseException:
        db.close()
        raise
    return db


class IndexSession:
    """One process's connection to a root's index; thread-safe.

    ``lock`` is held for a whole transaction (and for a read outside one);
    never during file I/O.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = os.path.join(root, DB_NAME)
        self.lock = threading.Lock()
        self.db = connect(self.path)

    @contextlib.contextmanager
    def txn(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, :attr:`lock` held throughout."""
        with self.lock:
            db = self.db
            when_unlocked(lambda: db.execute("BEGIN IMMEDIATE"))
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """``query`` run on the connection outside a transaction (:attr:`lock` held)."""
        with self.lock:
            return query(self.db)

    def close(self) -> None:
        with self.lock:
            self.db.close()
