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

The store's methods are wrapped on the instance, not by a wrapper class:
the backend and the pool tell a local store by its type.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvtier.policies.expiry import ExpiryClock
from kvtier.policies.tenancy import parse_expiry

from .layout import Store

__all__ = ["Expirer"]


class Expirer:
    """The expiry of one fs instance's blocks (doing nothing without ``expire``)."""

    def __init__(self, store: Store, options: Mapping[str, Any],
                 evict: Callable[[Sequence[bytes]], Sequence[bool]]) -> None:
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
        if self.enabled:
            store.read, store.read_into, store.size = (  # type: ignore[method-assign]
                self.read, self.read_into, self.size)
            store.write, store.remove = self.write, self.remove  # type: ignore[method-assign]

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
