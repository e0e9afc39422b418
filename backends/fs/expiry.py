"""The ``fs`` tier's ``expire``: a block expires after its write, or unused, and is a miss.

Each process keeps an :class:`~kvtier.policies.expiry.ExpiryClock` of the
blocks it writes and reads.  A block it has not seen (another process's, or
one on disk before the open) enters at first sight: for ``after`` at its
file's mtime on a local root (elsewhere at first sight); for ``unused`` at
first sight, as uses by other processes are not seen: so no process
expires a block sooner than its last use there.

A read (``read``, ``read_into``, and ``size`` for lookups) of an expired
block answers None, a miss, and queues the block; :meth:`Expirer.sweep`, on
every put and get, removes what is queued and what the clock finds due
through the backend's own evict, so the ledger and the shared pool count
the bytes freed.  A lookup answered from the index may still say True for
an expired block until that sweep.  The sweep finds due blocks in the order
they entered the clock; one entered late with an old mtime is found by its
next read instead.

A block may also get a **deadline** of its own (``kvtier_expire``,
:class:`Deadlines`, the backend's mixin): it expires then, or by
``expire``, whichever is first.  The deadline enters this process's clock
at once; under the shared pool it is also a row of the index
(:mod:`.pool_deadlines`), which every process on the root reads at its
next put or get at most :data:`POLL_S` later and enters in its own clock.
Without the pool (a remote root, ``capacity_scope: process``) the deadline
is this process's alone: its sweep deletes the file at the deadline, and it
is lost if the process exits first.  Without ``expire`` the store's methods
are wrapped at the first deadline.  ``kvtier_deadlines`` answers from this
process's clock, after a look at the pool's rows (at most every
:data:`POLL_S`, as a put or get looks): a deadline another process set is
answered, as it is enforced here, at most a second later.  A query of the
pool's rows at every call would answer it at once, at ~30 us a batch of 16
keys (several times that with the index busy), on every promotion from the
tier, nearly always for nothing.

The store's methods are wrapped on the instance, not by a wrapper class:
the backend and the pool tell a local store by its type.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvtier.policies.expiry import ExpiryClock
from kvtier.policies.tenancy import parse_expiry
from kvtier.spec import KvtierError
from kvtier.spec.base import Deadlines as DeadlinesLeft
from kvtier.spec.base import Expire

from .layout import Store
from .pool import SharedPool
from .pool_capacity import PoolCapacity
from .pool_deadlines import set_deadlines, since
from .room import Capacity

__all__ = ["POLL_S", "Deadlines", "Expirer"]

log = logging.getLogger("kvtier.backends.fs")

#: How often a process reads the deadlines other processes set (while it puts or gets).
POLL_S = 1.0


class Expirer:
    """The expiry of one fs instance's blocks (doing nothing without ``expire``)."""

    def __init__(self, store: Store, options: Mapping[str, Any],
                 evict: Callable[[Sequence[bytes]], Sequence[bool]],
                 pool_of: Callable[[], SharedPool | None] = lambda: None) -> None:
        expiry = parse_expiry(options.get("expire"))
        self.enabled = bool(expiry)
        self.tenant: str = options.get("tenant") or "default"
        self.expired = 0
        self._clock: ExpiryClock[bytes] = ExpiryClock(expiry)
        self._lock = threading.Lock()
        self._queued: set[bytes] = set()
        self._evict = evict
        self._sweeping = False
        self._store = store
        self._read, self._read_into, self._size = store.read, store.read_into, store.size
        self._write, self._remove = store.write, store.remove
        self._pool_of = pool_of  # the shared pool's deadlines, where there is one
        self._seq = 0  # the last row of the pool's deadlines read
        self._polled = float("-inf")
        if self.enabled:
            self._wrap()

    def _wrap(self) -> None:
        store = self._store
        store.read, store.read_into, store.size = (  # type: ignore[method-assign]
            self.read, self.read_into, self.size)
        store.write, store.remove = self.write, self.remove  # type: ignore[method-assign]

    # deadlines (kvtier_expire) ----------------------------------------------
    def deadline(self, keys: Sequence[bytes], at: float) -> None:
        """``keys`` expire at ``at`` (monotonic) at the latest, in this process."""
        with self._lock:
            for key in keys:
                self._clock.deadline(key, at)
            if not self.enabled:
                self.enabled = True
                self._wrap()

    def left(self, keys: Sequence[bytes]) -> list[float | None]:
        """Seconds left before ``keys``' own deadlines in this process's clock; None where
        there is none, or the block has expired (by it or by ``expire``)."""
        with self._lock:
            clock, now = self._clock, time.monotonic()
            return [clock.left(key, now) for key in keys]

    def past(self, key: bytes) -> bool:
        """Whether this process knows ``key``'s block to have expired."""
        with self._lock:
            return self._clock.expired(key, time.monotonic())

    def poll(self) -> None:
        """Enter the deadlines other processes set since the last look (:data:`POLL_S`)."""
        now = time.monotonic()
        if now - self._polled < POLL_S:
            return
        self._polled = now
        pool = self._pool_of()
        if pool is None:
            return
        if pool.session.lock.locked():  # a transaction of this process: not on a read's time
            self._polled = now - POLL_S / 2  # looked at again soon
            return
        try:
            self._seq, rows = since(pool, self._seq)
        except (KvtierError, sqlite3.Error, OSError) as exc:  # read again at the next look
            log.warning("fs tier: reading the pool's deadlines failed: %s", exc)
            return
        if rows:
            ahead = time.monotonic() - time.time()  # wall clock to this process's clock
            for key, at in rows:
                self.deadline([key], at + ahead)

    # the store's methods, wrapped ---------------------------------------------
    def read(self, key: bytes) -> bytes | None:
        if not self._fresh(key):
            return None
        data = self._read(key)
        self._seen(key, data is not None)
        return data

    def read_into(self, key: bytes, buffers: Sequence[memoryview]) -> int | None:
        if not self._fresh(key):
            return None
        size = self._read_into(key, buffers)
        self._seen(key, size is not None)
        return size

    def size(self, key: bytes) -> int | None:
        if not self._fresh(key):
            return None
        size = self._size(key)
        if size is None:
            self._seen(key, False)
        return size

    def write(self, key: bytes, parts: Sequence[Any], fsync: bool) -> int:
        size = self._write(key, parts, fsync)
        with self._lock:  # stored anew: its time starts again, and no sweep takes it
            self._queued.discard(key)
            self._clock.forget(key)
            self._clock.wrote(key, time.monotonic())
        return size

    def remove(self, key: bytes) -> bool:
        with self._lock:
            self._clock.forget(key)
        return self._remove(key)

    # sweeping ---------------------------------------------------------------
    def sweep(self) -> None:
        """Remove the blocks queued and due, through the backend's evict."""
        self.poll()
        if not self.enabled:
            return
        with self._lock:
            if self._sweeping:
                return
            due = self._clock.due(time.monotonic())
            keys = list(self._queued.union(due))
            self._queued.clear()
            if not keys:
                return
            self._sweeping = True
        try:
            removed = self._evict(keys)
        finally:
            with self._lock:
                self._sweeping = False
        with self._lock:
            self.expired += sum(map(bool, removed))

    def stats(self) -> dict[str, int]:
        if not self.enabled:
            return {}
        with self._lock:
            return {"expired": self.expired, f"tenant_expired.{self.tenant}": self.expired}

    # internals --------------------------------------------------------------
    def _fresh(self, key: bytes) -> bool:
        """False (and queued) where ``key``'s block has expired; enters it at first sight."""
        now = time.monotonic()
        with self._lock:
            if key not in self._clock:
                self._clock.wrote(key, self._written_at(key, now))
                self._clock.used(key, now)
            if self._clock.expired(key, now):
                self._clock.forget(key)
                self._queued.add(key)
                return False
        return True

    def _seen(self, key: bytes, found: bool) -> None:
        with self._lock:
            if found:
                self._clock.used(key, time.monotonic())
            else:
                self._clock.forget(key)

    def _written_at(self, key: bytes, now: float) -> float:
        """``key``'s file's mtime on the monotonic clock, where it is a local file."""
        if self._clock.after is None or not self._store.local:
            return now
        try:
            return now - max(0.0, time.time() - os.stat(self._store.path(key)).st_mtime)
        except OSError:
            return now


class Deadlines(Expire, DeadlinesLeft):
    """Mixin of :class:`~kvtier.backends.fs.FsBackend`: ``kvtier_expire`` and
    ``kvtier_deadlines`` (module docstring)."""

    _capacity: Capacity
    _expirer: Expirer

    def _deadline_pool(self) -> SharedPool | None:
        capacity = self._capacity
        return capacity.pool if isinstance(capacity, PoolCapacity) else None

    def _expire(self, keys: Sequence[bytes], after: float) -> list[bool | None]:
        expirer = self._expirer
        expirer.sweep()  # the blocks due leave first: they answer None
        at = time.monotonic() + after
        unique = list(dict.fromkeys(keys))
        found = self._lookup(unique)
        held = [k for k, f in zip(unique, found, strict=True) if f and not expirer.past(k)]
        pool = self._deadline_pool()
        answers: dict[bytes, bool | None] = dict.fromkeys(unique)
        if held and pool is not None:  # every process on the root
            answers.update(zip(held, set_deadlines(pool, held, time.time() + after),
                               strict=True))
        else:
            answers.update(dict.fromkeys(held, True))
        expirer.deadline([k for k in held if answers[k]], at)
        return [answers[k] for k in keys]

    def _deadlines(self, keys: Sequence[bytes]) -> list[float | None]:
        self._expirer.poll()  # the deadlines other processes set (module docstring)
        left = self._expirer.left(keys)
        asked = [j for j, seconds in enumerate(left) if seconds is not None]
        if asked:  # a deadline of a block no longer held is none
            for j, found in zip(asked, self._lookup([keys[j] for j in asked]), strict=True):
                if not found:
                    left[j] = None
        return left
