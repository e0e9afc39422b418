"""The shared pool's eviction policies: the index's schema, and the order of its victims.

:class:`~kvtier.backends.fs.pool.SharedPool` asks its policy, inside the
evictor's transaction, which blocks to mark ``D``, and hands it the uses and
the rows of new blocks.  ``lru`` orders the rows by ``used`` (the last use,
in ns).  ``s3fifo`` is :class:`kvtier.policies.S3Fifo` written in SQL
on the same rows, with the same decisions for the same admits and uses:

- ``queue`` (0: the small queue S, 1: the main queue M), ``freq`` (uses, at
  most 3) and ``seq`` (the FIFO order, from the counter ``meta.seq``) on each
  row; ``ghosts`` holds the keys (and byte weights, at least 1) evicted from S,
  their bytes summed per namespace and for the root in ``meta``.
- A new row enters S, or M if its key is a ghost; the ghosts are then trimmed
  to the capacity less S's share, oldest first.  Rows found at open or left by
  a dead process's journal enter S first in line (``seq`` 0).
- To free room: S's oldest moves to M (its count reset) if it was used while
  in S, else it is evicted and its key becomes a ghost, while S holds its
  tenth of the capacity or M is empty; else M's oldest goes back to M's tail
  with its count lowered, or is evicted at 0.
- Under ``min_free`` alone (no capacity) the tenth is of the bytes held.

Every process on a root must use the same policy: the first to open an index
records its own in ``meta``, and one asking for another is refused with a
:class:`~kvtier.spec.ConfigError`; an index that records none (written by
the previous version) takes the first opener's.  The columns are added when
an ``s3fifo`` process opens an index without them (``ALTER TABLE ... ADD
COLUMN``; the rows' ``seq`` is their ``used``, so S starts in the order of
their last use); an ``lru`` root keeps the previous version's table, so
processes of that version can still share it.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kvtier.block.namespace import Namespace
from kvtier.policies import S3Fifo, supported
from kvtier.spec import ConfigError

from .pool_keep import NOT_KEPT
from .pool_keep import SCHEMA as KEPT_SCHEMA
from .pool_writers import alive

log = logging.getLogger("kvtier.backends.fs")

__all__ = ["POLICIES", "PoolPolicy", "prepare"]

#: The fs tier's eviction policies (its one declaration): those written in SQL here.
POLICIES = supported("lru", "s3fifo")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS blocks(
    ns TEXT NOT NULL, key BLOB NOT NULL, size INTEGER NOT NULL, state TEXT NOT NULL,
    writer TEXT NOT NULL, used INTEGER NOT NULL, PRIMARY KEY (ns, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS blocks_lru ON blocks(state, used);
CREATE INDEX IF NOT EXISTS blocks_ns_lru ON blocks(ns, state, used);
CREATE TABLE IF NOT EXISTS totals(
    scope TEXT PRIMARY KEY, bytes INTEGER NOT NULL, inflight INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS writers(
    writer TEXT PRIMARY KEY, ns TEXT NOT NULL, held INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS lease(
    id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL, expires REAL NOT NULL);
INSERT OR IGNORE INTO totals VALUES ('*', 0, 0);
INSERT OR IGNORE INTO lease VALUES (1, '', 0);
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value NOT NULL);
CREATE TABLE IF NOT EXISTS ghosts(
    ns TEXT NOT NULL, key BLOB NOT NULL, weight INTEGER NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (ns, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ghosts_fifo ON ghosts(seq);
CREATE INDEX IF NOT EXISTS ghosts_ns_fifo ON ghosts(ns, seq);
""" + KEPT_SCHEMA
#: The columns S3-FIFO adds to ``blocks``; an index from before them gets them at open.
_COLUMNS = {"queue": "INTEGER NOT NULL DEFAULT 0", "freq": "INTEGER NOT NULL DEFAULT 0",
            "seq": "INTEGER NOT NULL DEFAULT 0"}
_FIFO_INDEXES = """
CREATE INDEX IF NOT EXISTS blocks_fifo ON blocks(state, queue, seq);
CREATE INDEX IF NOT EXISTS blocks_ns_fifo ON blocks(ns, state, queue, seq)
"""
_MAX_FREQ = S3Fifo.MAX_FREQ
_SMALL_DIVISOR = S3Fifo.SMALL_DIVISOR

Row = tuple[str, bytes, int]
Where = tuple[str, tuple[Any, ...]]  # a condition on the rows ("... AND "), its arguments
_COUNT_S = 1.0  # stats count the index's rows at most this often, and at most 1% of the time,
_CHEAP_S = 1e-3  # ... unless the last count took less than this: then at every call

#: The namespace where a chain records the descriptors of its namespaces (model, dtype,
#: ...), each under the fingerprint of the namespace it describes:
#: ``kvtier.chain.catalog.CATALOG`` (a test checks that they agree).
CATALOG_NS = Namespace(model="kvtier/catalog").hex
#: A descriptor is no victim while its namespace has blocks, or a process holding it
#: open (its first blocks may be in flight): without it ``kvtier inspect`` cannot name
#: their model, and ``kvtier purge --model`` cannot find them.  Nor is a block marked
#: kept (:mod:`.pool_keep`).
_KEPT = (f"NOT (blocks.ns = '{CATALOG_NS}' AND (EXISTS (SELECT 1 FROM blocks AS b "
         "WHERE b.ns = lower(hex(blocks.key))) OR EXISTS (SELECT 1 FROM writers AS w "
         f"WHERE w.ns = lower(hex(blocks.key))))) AND {NOT_KEPT}")


def prepare(db: sqlite3.Connection, eviction: str, root: str, ns: str,
            capacity: int | None, scope: str, me: str) -> PoolPolicy:
    """Create or migrate the index (in a transaction) and answer its policy; refuse a
    policy, or a capacity, other than the one the index records; register ``me`` as
    a process holding the pool open."""
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    db.execute("INSERT OR IGNORE INTO meta VALUES ('eviction', ?)", (eviction,))
    recorded = db.execute("SELECT value FROM meta WHERE name = 'eviction'").fetchall()[0][0]
    if recorded != eviction:
        raise ConfigError(
            f"fs tier {root}: its shared pool evicts by {recorded}, every process on a root "
            f"must use one policy; set eviction: {recorded}, or close every process on the "
            f"root and delete {root}/.kvtier-pool.db (rebuilt from the files at the next "
            "open) to change it", key="eviction")
    if eviction == "s3fifo":
        _add_fifo(db)
    _one_capacity(db, root, ns, capacity, scope, me)
    db.execute("INSERT OR IGNORE INTO totals VALUES (?, 0, 0)", (ns,))
    return PoolPolicy(eviction, capacity, scope)


def _one_capacity(db: sqlite3.Connection, root: str, ns: str, capacity: int | None,
                  scope: str, me: str) -> None:
    """Every process holding a scope open bounds it by one capacity: a process asking
    for another is refused while a live one holds it open (each that takes room would
    evict down to its own; 2 MiB beside 8 MiB evicted 8,842 blocks for 2,488 puts).
    With none left, the opener's capacity is recorded: a pool is resized by opening
    it with the new capacity once every process on it is closed.  Then ``me`` is
    registered (a ``writers`` row of no credit, deleted at close or once dead)."""
    name, want = f"capacity:{scope}", capacity or 0  # 0: none, min_free alone
    recorded = db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchall()
    if recorded and recorded[0][0] != want:
        mine = "" if scope == "*" else "AND ns = ? "
        holders = [writer for (writer,) in db.execute(
            f"SELECT writer FROM writers WHERE writer != ? {mine}ORDER BY writer",
            (me,) if scope == "*" else (me, scope)) if alive(writer)]
        what = "the root's" if scope == "*" else f"namespace {scope}'s"
        if holders:
            pids = ", ".join(sorted({h.split(":", 1)[0] for h in holders}, key=int))
            raise ConfigError(
                f"fs tier {root}: {what} shared pool has capacity {_size(recorded[0][0])}, "
                f"this process asks for {_size(want)}; every process on a pool must use one "
                f"capacity: set capacity: {recorded[0][0] or 'unset'}, or, to resize the "
                f"pool, close the processes holding it open (pids {pids}) and open it with "
                "the new capacity", key="capacity")
        log.warning("fs tier %s: %s shared pool resized from %s to %s (no process held it "
                    "open)", root, what, _size(recorded[0][0]), _size(want))
    db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, want))
    db.execute("INSERT OR IGNORE INTO writers VALUES (?, ?, 0)", (me, ns))


def _size(value: int) -> str:
    from kvtier.config.units import format_size  # as pool_options's parse_size: no cycle at import

    return "unset" if not value else f"{value} bytes ({format_size(value)})"


def _add_fifo(db: sqlite3.Connection) -> None:
    """S3-FIFO's columns, indexes and counter, where missing.  Only on an s3fifo root: an
    lru root keeps the previous version's ``blocks``, whose processes insert whole rows,
    and its writes maintain no index they do not use."""
    have = {row[1] for row in db.execute("PRAGMA table_info(blocks)")}
    for name, decl in _COLUMNS.items():
        if name not in have:
            db.execute(f"ALTER TABLE blocks ADD COLUMN {name} {decl}")
    if "seq" not in have:
        db.execute("UPDATE blocks SET seq = used")
    for statement in _FIFO_INDEXES.split(";"):
        if statement.strip():
            db.execute(statement)
    db.execute("INSERT OR IGNORE INTO meta VALUES ('seq', "
               "(SELECT COALESCE(MAX(seq), 0) FROM blocks))")


class PoolPolicy:
    """One process's view of the root's policy, for its scope (``*``: every namespace)."""

    def __init__(self, eviction: str, capacity: int | None, scope: str) -> None:
        self.fifo = eviction == "s3fifo"
        self.capacity = capacity
        self.scope = scope
        self.where = "" if scope == "*" else "ns = ? AND "
        self.args: tuple[Any, ...] = () if scope == "*" else (scope,)
        # counts(): when, its cost (the least of the last two counts'), what
        self._counted = (-1e9, 0.0, (0, 0, 0))
        self._last_cost = 0.0

    # uses and new rows -----------------------------------------------------------
    def touch(self, used: dict[bytes, int], keys: Any, now: int) -> None:
        """Note reads of ``keys`` in ``used``: the last time (lru) or how many (s3fifo)."""
        if self.fifo:
            for key in keys:
                used[key] = used.get(key, 0) + 1
        else:
            for key in keys:
                used[key] = now

    def merge(self, old: Mapping[bytes, int], new: Mapping[bytes, int]) -> dict[bytes, int]:
        """The uses of a rolled back flush, ``old``, put back under the ones since."""
        if not self.fifo:
            return {**old, **new}
        return {key: old.get(key, 0) + new.get(key, 0) for key in {**old, **new}}

    def record_uses(self, db: sqlite3.Connection, ns: str, used: Mapping[bytes, int]) -> None:
        if self.fifo:
            db.executemany(f"UPDATE blocks SET freq = MIN({_MAX_FREQ}, freq + ?) "
                           "WHERE ns = ? AND key = ? AND state = 'S'",
                           [(n, ns, key) for key, n in used.items()])
        else:
            db.executemany("UPDATE blocks SET used = ? WHERE ns = ? AND key = ? AND state = 'S'",
                           [(when, ns, key) for key, when in used.items()])

    def admitted(self, db: sqlite3.Connection, ns: str, keys: list[bytes]) -> None:
        """The rows of ``keys``, just made, enter S or (a ghost's) M, in that order."""
        if not self.fifo or not keys:
            return
        for key in keys:
            hit = self._unghost(db, ns, key)
            db.execute("UPDATE blocks SET queue = ?, freq = 0, seq = ? WHERE ns = ? AND key = ?",
                       (1 if hit else 0, self._next(db), ns, key))
            self._trim(db)

    def _trim(self, db: sqlite3.Connection) -> None:
        limit = self._capacity(db) - self._target(db)
        name = f"ghosts:{self.scope}"
        while (db.execute("SELECT COALESCE(MAX(value), 0) FROM meta WHERE name = ?",
                          (name,)).fetchall()[0][0] > limit):
            row = db.execute(f"SELECT ns, key FROM ghosts WHERE {self.where}1 "
                             "ORDER BY seq LIMIT 1", self.args).fetchall()
            if not row:
                break
            self._unghost(db, *row[0])

    @staticmethod
    def _ghost_bytes(db: sqlite3.Connection, ns: str, delta: int) -> None:
        db.executemany("INSERT INTO meta VALUES (?, ?) ON CONFLICT (name) "
                       "DO UPDATE SET value = value + excluded.value",
                       [(f"ghosts:{ns}", delta), ("ghosts:*", delta)])

    def _unghost(self, db: sqlite3.Connection, ns: str, key: bytes) -> bool:
        """Forget the ghost of ``key``; answer whether there was one."""
        hit = db.execute("DELETE FROM ghosts WHERE ns = ? AND key = ? RETURNING weight",
                         (ns, key)).fetchall()
        if hit:
            self._ghost_bytes(db, ns, -hit[0][0])
        return bool(hit)

    def kept(self, db: sqlite3.Connection, ns: str, key: bytes, now: int) -> None:
        """A victim whose file could not be deleted stays, the last in line."""
        if self.fifo:
            db.execute("UPDATE blocks SET state = 'S', queue = 1, freq = 0, seq = ? "
                       "WHERE ns = ? AND key = ? AND state = 'D'", (self._next(db), ns, key))
        else:
            db.execute("UPDATE blocks SET state = 'S', used = ? "
                       "WHERE ns = ? AND key = ? AND state = 'D'", (now, ns, key))

    # victims -------------------------------------------------------------------
    def _among(self, among: Sequence[str] | None,
               everywhere: bool = False) -> tuple[str, tuple[Any, ...]]:
        """The rows' condition: the scope's (or the root's if ``everywhere``), of the
        namespaces ``among`` only where given (a tenant's, :mod:`.pool_tenants`)."""
        where, args = ("", ()) if everywhere else (self.where, self.args)
        if among is not None:
            where += f"ns IN ({', '.join('?' * len(among))}) AND " if among else "0 AND "
            args += tuple(among)
        return where, args

    def choose(self, db: sqlite3.Connection, need: int, among: Sequence[str] | None = None,
               everywhere: bool = False) -> list[Row]:
        """Mark ``D`` the scope's victims, in the policy's order, until ``need`` bytes; of
        the namespaces ``among`` only where given, those of the whole root if
        ``everywhere`` (a tenant's own, beyond its quota: :mod:`.pool_tenants`)."""
        where = self._among(among, everywhere)
        if self.fifo:
            return self._fifo(db, need, where)  # marks each as it goes: the next is another
        victims = self._lru(db, need, where)
        db.executemany("UPDATE blocks SET state = 'D' WHERE ns = ? AND key = ?",
                       [(ns, key) for ns, key, _ in victims])
        return victims

    def _lru(self, db: sqlite3.Connection, need: int, among: Where) -> list[Row]:
        rows = db.execute(f"SELECT ns, key, size FROM blocks WHERE {among[0]}state = 'S' "
                          f"AND {_KEPT} ORDER BY used", among[1])
        victims: list[Row] = []
        total = 0
        for ns, key, size in rows:
            if total >= need:
                break
            victims.append((ns, key, size))
            total += size
        rows.close()  # ends the statement, so that the commit is not held by it
        return victims

    def _fifo(self, db: sqlite3.Connection, need: int, among: Where) -> list[Row]:
        """S3Fifo's ``_evict_one`` until ``need`` bytes are evicted; of the rows ``among``
        selects (S's share is the scope's: a tenant's victims are its oldest of S
        while the scope's S is beyond its tenth)."""
        small = db.execute(f"SELECT COALESCE(SUM(size), 0) FROM blocks WHERE {self.where}"
                           "state = 'S' AND queue = 0", self.args).fetchall()[0][0]
        target = self._target(db)
        victims: list[Row] = []
        freed = 0
        while freed < need:
            s, m = self._oldest(db, 0, among), self._oldest(db, 1, among)
            if s is not None and (small >= target or m is None):
                ns, key, size, freq = s
                small -= size
                if freq > 0:  # used again while in S: worth a place in M
                    db.execute("UPDATE blocks SET queue = 1, freq = 0, seq = ? "
                               "WHERE ns = ? AND key = ?", (self._next(db), ns, key))
                    continue
                self._unghost(db, ns, key)  # none: its row was made without a look
                db.execute("INSERT INTO ghosts VALUES (?, ?, ?, ?)",
                           (ns, key, max(size, 1), self._next(db)))
                self._ghost_bytes(db, ns, max(size, 1))
            elif m is not None:
                ns, key, size, freq = m
                if freq > 0:
                    db.execute("UPDATE blocks SET freq = ?, seq = ? WHERE ns = ? AND key = ?",
                               (freq - 1, self._next(db), ns, key))
                    continue
            else:
                break  # nothing left in the scope
            db.execute("UPDATE blocks SET state = 'D' WHERE ns = ? AND key = ?", (ns, key))
            victims.append((ns, key, size))
            freed += size
        return victims

    def _oldest(self, db: sqlite3.Connection, queue: int,
                among: Where) -> tuple[str, bytes, int, int] | None:
        row = db.execute(f"SELECT ns, key, size, freq FROM blocks WHERE {among[0]}"
                         f"state = 'S' AND queue = ? AND {_KEPT} ORDER BY seq LIMIT 1",
                         (*among[1], queue)).fetchall()
        return row[0] if row else None

    def stored(self, db: sqlite3.Connection, evictable: bool = False,
               among: Sequence[str] | None = None, everywhere: bool = False) -> int:
        """Bytes of the blocks stored in the scope (``evictable``: that may be victims;
        ``among`` and ``everywhere`` as for :meth:`choose`)."""
        kept = f" AND {_KEPT}" if evictable else ""
        where, args = self._among(among, everywhere)
        return int(db.execute(f"SELECT COALESCE(SUM(size), 0) FROM blocks WHERE {where}"
                              f"state = 'S'{kept}", args).fetchall()[0][0])

    def counts(self, db: sqlite3.Connection, ns: str, writer: str, landed: int,
               stored: int) -> tuple[int, int, int]:
        """:meth:`figures`, with ``landed`` blocks of ``stored`` bytes ``writer`` wrote and
        has not made rows for yet; counted (a scan, which the stats an engine reads at
        every step would repeat) at every call while a count takes less than
        :data:`_CHEAP_S` (an index of thousands of rows), else at most every
        :data:`_COUNT_S`, or 100 times as long as counting took.  The cost is the least
        of the last two counts': one count held up (its thread descheduled, a checkpoint
        of the log) is no large index, and left the figures a second stale."""
        now = time.monotonic()
        when, cost, counts = self._counted
        if cost < _CHEAP_S or now - when > max(_COUNT_S, 100 * cost):
            blocks, own_blocks, own_bytes = self.figures(db, ns, writer)
            counts = blocks + landed, own_blocks + landed, own_bytes + stored
            took = time.monotonic() - now
            self._counted = now, min(took, self._last_cost), counts
            self._last_cost = took
        return counts

    def figures(self, db: sqlite3.Connection, ns: str, writer: str) -> tuple[int, int, int]:
        """The scope's blocks; the blocks and bytes of ``ns`` that ``writer`` wrote (or
        found at open) and the pool holds."""
        blocks = db.execute(f"SELECT COUNT(*) FROM blocks WHERE {self.where}1",
                            self.args).fetchall()[0][0]
        own_blocks, own_bytes = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM blocks WHERE ns = ? AND writer = ?",
            (ns, writer)).fetchall()[0]
        return blocks, own_blocks, own_bytes

    def _capacity(self, db: sqlite3.Connection) -> int:
        return self.capacity if self.capacity is not None else self.stored(db)

    def _target(self, db: sqlite3.Connection) -> int:
        """S's share: a tenth of the capacity, as S3Fifo's."""
        return max(1, self._capacity(db) // _SMALL_DIVISOR)

    @staticmethod
    def _next(db: sqlite3.Connection) -> int:
        return int(db.execute("UPDATE meta SET value = value + 1 WHERE name = 'seq' "
                              "RETURNING value").fetchall()[0][0])
