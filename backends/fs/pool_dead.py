"""What a process that died left in the shared pool (:mod:`kvtier.backends.fs.pool`).

The evictor settles it, in its transaction, before it chooses victims: the
dead process's credit is given back, and the files its journal names that no
row counts are counted (published by a rename, so whole).  A process is dead
when its pid is: the sharers of a root share one pid namespace.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable

from .local import LocalStore
from .sharing import alive, journal_keys, journal_path

__all__ = ["ROW", "settle_dead"]

ROW = "(ns, key, size, state, writer, used)"  # the policy's columns take their defaults

#: Adds bytes (and bytes in flight) to a namespace's totals and the root's.
Add = Callable[[sqlite3.Connection, str, int, int], None]


def settle_dead(db: sqlite3.Connection, root: str, me: str, add: Add) -> None:
    """Settle every writer of the index but ``me`` whose process is gone."""
    now = time.time_ns()
    for writer, ns, held in db.execute("SELECT writer, ns, held FROM writers "
                                       "WHERE writer != ?", (me,)).fetchall():
        if alive(writer):
            continue
        add(db, ns, -held, -held)
        files = LocalStore(f"{root}/{ns}")
        path = journal_path(root, writer)
        for key in journal_keys(path):
            size = files.size(key)
            if size is not None and db.execute(
                    f"INSERT OR IGNORE INTO blocks{ROW} VALUES (?, ?, ?, 'S', ?, ?)",
                    (ns, key, size, writer, now)).rowcount:
                add(db, ns, size, 0)
        db.execute("DELETE FROM writers WHERE writer = ?", (writer,))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
