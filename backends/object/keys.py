"""The ``object`` backend's bookkeeping of keys: lookups' presence cache, capacity's index.

None is thread-safe: the backend's lock guards them.  The bucket stays the
authority; these only spare requests (a HEAD per lookup) and remember what a
LIST found (the index), so that capacity and age can be enforced by deleting
objects: the oldest (:class:`KeyIndex`, ``eviction: fifo``) or the ones
S3-FIFO drops (:class:`S3FifoIndex`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import TypeAlias

from kvtier.policies import S3Fifo, supported

__all__ = ["CACHE_MAX", "INDEXES", "Index", "KeyIndex", "PresenceCache", "S3FifoIndex"]

#: What a LIST found, one tuple per object: last-modified epoch, name, key, size.
Listing: TypeAlias = Iterable[tuple[float, str, bytes, int]]

#: Presence-cache entries kept before expired ones are swept.
CACHE_MAX = 1 << 16


class PresenceCache:
    """Short-lived answers to "is this key stored?"; ``ttl`` <= 0 keeps none."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        # key -> (present, expiry on the monotonic clock)
        self._entries: dict[bytes, tuple[bool, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes, now: float) -> bool | None:
        """The cached answer for ``key``, None if there is none still valid at ``now``."""
        entry = self._entries.get(key)
        return entry[0] if entry is not None and entry[1] > now else None

    def remember(self, key: bytes, present: bool) -> None:
        if self.ttl <= 0:
            return
        now = time.monotonic()
        if len(self._entries) >= CACHE_MAX:
            self._entries = {k: v for k, v in self._entries.items() if v[1] > now}
            if len(self._entries) >= CACHE_MAX:
                self._entries.clear()
        self._entries[key] = (present, now + self.ttl)

    def drop(self, key: bytes) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()


class KeyIndex:
    """Each stored key's size and last-modified epoch, oldest first; ``used`` sums the sizes.

    ``trim`` drops the oldest until ``used`` <= ``capacity`` (None: never).
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[bytes, tuple[int, float]] = OrderedDict()
        self.used = 0

    def rebuild(self, listed: Listing, cutoff: float | None, since: float) -> list[bytes]:
        """Hold what a LIST found, oldest first, then this instance's entries of ``since``
        or later (stored while the LIST ran); the listed keys older than ``cutoff`` are
        left out and returned (None: none are too old)."""
        recent = [(k, e) for k, e in self._entries.items() if e[1] >= since]
        self._entries.clear()
        self.used = 0
        expired = []
        for mtime, _, key, size in sorted(listed):
            if cutoff is not None and mtime < cutoff:
                expired.append(key)
            else:
                self.add(key, size, mtime)
        for key, (size, mtime) in recent:
            self.add(key, size, mtime)
        return expired

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def add(self, key: bytes, size: int, mtime: float) -> None:
        """Record ``key`` as the newest entry, unless it is there already."""
        if key not in self._entries:
            self._entries[key] = (size, mtime)
            self.used += size

    def access(self, key: bytes) -> None:
        """A get that found ``key``: no use here, the oldest written leaves first."""

    def forget(self, key: bytes) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.used -= entry[0]

    def entry(self, key: bytes) -> tuple[int, float] | None:
        """``key``'s size and last-modified epoch, None if it is not held."""
        return self._entries.get(key)

    def restore(self, key: bytes, size: int, mtime: float) -> None:
        """Hold ``key`` again, a victim put back (kept, :mod:`.kept`): the newest entry."""
        self.add(key, size, mtime)

    def trim(self) -> list[bytes]:
        """Drop the oldest entries until ``used`` <= ``capacity``; the keys dropped."""
        dropped = []
        capacity = self.capacity
        while capacity is not None and self.used > capacity and self._entries:
            key, (size, _) = self._entries.popitem(last=False)
            self.used -= size
            dropped.append(key)
        return dropped


class S3FifoIndex:
    """The stored keys in an :class:`~kvtier.policies.S3Fifo` of ``capacity``
    bytes, fed keys and sizes (as ``kvtier plan`` replays), so its victims are the
    policy's own.

    An object store cannot reorder objects: the queues, counts and ghosts live
    here, fed by this instance alone.  ``add`` admits a key not held (evicting
    as S3-FIFO does; ``trim`` hands the victims over) and is a use of a key
    held, as a get that found it (``access``).  A rebuild keeps the queues and
    counts of the keys still listed, drops the others without a ghost (gone
    from the bucket, not evicted), and lets listed keys not held enter, in
    last-modified order, with no eviction until ``trim``.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._policy = S3Fifo(capacity)
        self._mtimes: dict[bytes, float] = {}  # the keys held, with their last-modified epoch
        self._victims: list[bytes] = []  # evicted, not yet handed over by trim

    @property
    def used(self) -> int:
        return self._policy.used

    def rebuild(self, listed: Listing, cutoff: float | None, since: float) -> list[bytes]:
        """As :meth:`KeyIndex.rebuild`, keeping the policy's state of the keys kept."""
        expired, kept = [], []
        for entry in sorted(listed):
            if cutoff is not None and entry[0] < cutoff:
                expired.append(entry[2])
            else:
                kept.append(entry)
        still = {key for _, _, key, _ in kept}
        for key, mtime in list(self._mtimes.items()):
            if key not in still and mtime < since:
                self.forget(key)
        for mtime, _, key, size in kept:
            if key not in self._mtimes:
                self._enter(key, size, mtime)
        return expired

    def _enter(self, key: bytes, size: int, mtime: float) -> None:
        # no room made first: the LIST says the object is there, and trim decides
        # what leaves, as after a put
        self._policy.enter(key, size)
        self._mtimes[key] = mtime

    def __len__(self) -> int:
        return len(self._mtimes)

    def __contains__(self, key: object) -> bool:
        return key in self._mtimes

    def add(self, key: bytes, size: int, mtime: float) -> None:
        """Admit ``key`` of ``size`` <= ``capacity`` bytes; a key held is used instead."""
        if key in self._mtimes:
            self._policy.access(key)
            return
        victims = self._policy.admit(key, size)
        for gone in victims:
            del self._mtimes[gone]
        self._victims.extend(victims)
        self._mtimes[key] = mtime

    def access(self, key: bytes) -> None:
        """A get that found ``key``: a use, if it is held."""
        self._policy.access(key)

    def forget(self, key: bytes) -> None:
        """``key`` left the bucket otherwise (an explicit evict, another writer): no ghost."""
        if self._mtimes.pop(key, None) is not None:
            self._policy.remove(key)

    def entry(self, key: bytes) -> tuple[int, float] | None:
        """``key``'s size and last-modified epoch, None if it is not held."""
        mtime, size = self._mtimes.get(key), self._policy.size(key)
        return None if mtime is None or size is None else (size, mtime)

    def restore(self, key: bytes, size: int, mtime: float) -> None:
        """Hold ``key`` again, a victim put back (kept, :mod:`.kept`), with no eviction
        until ``trim``."""
        if key not in self._mtimes:
            self._enter(key, size, mtime)

    def trim(self) -> list[bytes]:
        """Evict until ``used`` <= ``capacity``; the keys evicted since the last trim."""
        for gone in self._policy.shed():
            del self._mtimes[gone]
            self._victims.append(gone)
        dropped, self._victims = self._victims, []
        return dropped


Index: TypeAlias = "KeyIndex | S3FifoIndex"
#: The capacity's index of each ``eviction`` option: the order written (``fifo``, no
#: policy: an object store cannot reorder its objects), or a policy of the registry.
INDEXES = ("fifo", *supported("s3fifo"))
