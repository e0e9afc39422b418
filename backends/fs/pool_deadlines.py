"""Deadlines in the shared pool: the index's ``deadlines`` table, every process's.

A row ``(ns, key, at)`` gives the block of that row of ``blocks`` a deadline
(``kvtier_expire``): ``at`` is wall-clock seconds (``time.time()``), as
processes share no monotonic clock.  A row is set by one transaction, where
the block has its row (state ``S``), and only brings an earlier deadline:
``at`` is the least of those given.  Each row takes a new ``seq``
(``AUTOINCREMENT``: never reused), so a process reads the rows set since its
last look (:func:`since`) and enters them in its own clock
(:mod:`.expiry`), which expires them exactly from then on.

A deadline goes with its block: a trigger deletes the row with the block's
row, whichever process deletes it (an evict, an expiry, the evictor, a file
found gone at open), so a block stored again under the key later has none.
The trigger lives in the index, so a process of a version that knows no
deadlines deletes them too.  A rebuilt index starts without deadlines: the
blocks there keep the tier's ``expire`` alone (a deadline is not in the
block's file), never a deadline of another block.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .pool_db import IndexReplaced

if TYPE_CHECKING:  # the pool prepares the table: it imports this module
    from .pool import SharedPool

__all__ = ["SCHEMA", "prepare", "set_deadlines", "since"]

SCHEMA = ("CREATE TABLE IF NOT EXISTS deadlines(seq INTEGER PRIMARY KEY AUTOINCREMENT, "
          "ns TEXT NOT NULL, key BLOB NOT NULL, at REAL NOT NULL, UNIQUE (ns, key))")
#: One statement (its body's ``;`` is its own): the deadline leaves with the block's row.
_TRIGGER = ("CREATE TRIGGER IF NOT EXISTS deadlines_leave AFTER DELETE ON blocks BEGIN "
            "DELETE FROM deadlines WHERE ns = OLD.ns AND key = OLD.key; END")


def prepare(db: sqlite3.Connection) -> None:
    """Create the table and its trigger in ``db`` (every index the pool opens)."""
    db.execute(SCHEMA)
    db.execute(_TRIGGER)


def set_deadlines(pool: SharedPool, keys: Sequence[bytes], at: float) -> list[bool | None]:
    """Give ``keys`` of the pool's namespace the deadline ``at`` (wall clock) for every
    process: per key True where the block has its row, None where not."""
    try:
        return _set(pool, keys, at)
    except IndexReplaced:
        return _set(pool, keys, at)  # in the new index, as the pool's keep


def _set(pool: SharedPool, keys: Sequence[bytes], at: float) -> list[bool | None]:
    out: list[bool | None] = []
    with pool.session.txn() as db:
        pool._flush(db, spare=False)  # the writes landed get their rows
        for key in keys:
            if not db.execute("SELECT 1 FROM blocks WHERE ns = ? AND key = ? AND state = 'S'",
                              (pool.ns, key)).fetchall():
                out.append(None)
                continue
            # a new row (a new seq, for the others to read) only for an earlier deadline
            db.execute("INSERT OR REPLACE INTO deadlines(ns, key, at) SELECT ?, ?, ? "
                       "WHERE NOT EXISTS (SELECT 1 FROM deadlines WHERE ns = ? AND key = ? "
                       "AND at <= ?)", (pool.ns, key, at, pool.ns, key, at))
            out.append(True)
    return out


def since(pool: SharedPool, seq: int) -> tuple[int, list[tuple[bytes, float]]]:
    """The deadlines of the pool's namespace set after ``seq``, and the last seq read.
    An index rebuilt since numbers from 1 again: then every row is read."""
    def query(db: sqlite3.Connection) -> tuple[int, list[tuple[bytes, float]]]:
        last = int(db.execute("SELECT COALESCE(MAX(seq), 0) FROM deadlines").fetchall()[0][0])
        start = seq if last >= seq else 0
        # by the seq (the rowid) alone: +ns keeps SQLite off the (ns, key) index, which
        # walks every row of the namespace (2,000 rows, none new: 132 us, against 4 us)
        rows = db.execute("SELECT key, at FROM deadlines WHERE seq > ? AND +ns = ?",
                          (start, pool.ns)).fetchall()
        return last, [(bytes(key), float(at)) for key, at in rows]

    return pool.session.read(query)
