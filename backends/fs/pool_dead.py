"""What a process that died left in the shared pool (:mod:`kvtier.backends.fs.pool`).

The evictor settles it, in its transaction, before it chooses victims: the
dead process's credit is given back, and the files its journal names that no
row counts are counted (published by a rename, so whole).  The temporary
files of the writes it had under way (``.tmp-<pid>-...`` beside the blocks its
journal names) were counted in its credit until then: they are removed as the
credit is given back, not left for an open 10 minutes later.  A process is
dead when its pid is: the sharers of a root share one pid namespace.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable

from .layout import TMP_PREFIX, listdir
from .local import LocalStore
from .pool_writers import alive, journal_keys, journal_path

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
        files = LocalStore(f"{root}/{ns}")
        path = journal_path(root, writer)
        keys = journal_keys(path)
        drop_temporary(files, keys, writer)
        add(db, ns, -held, -held)
        for key in keys:
            size = files.size(key)
            if size is not None and db.execute(
                    f"INSERT OR IGNORE INTO blocks{ROW} VALUES (?, ?, ?, 'S', ?, ?)",
                    (ns, key, size, writer, now)).rowcount:
                add(db, ns, size, 0)
        db.execute("DELETE FROM writers WHERE writer = ?", (writer,))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def drop_temporary(files: LocalStore, keys: set[bytes], writer: str) -> int:
    """Remove the temporary files ``writer`` (dead) left beside the blocks of ``keys``;
    answer how many.  Its writes were published by a rename: what is left was never
    a block."""
    prefix = f"{TMP_PREFIX}{writer.split(':', 1)[0]}-"
    removed = 0
    for leaf in {os.path.dirname(files.path(key)) for key in keys}:
        for entry in listdir(leaf):
            if entry.name.startswith(prefix):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
    return removed
