"""The ``object`` backend's bookkeeping of keys: lookups' presence cache, capacity's index.

Neither is thread-safe: the backend's lock guards both.  The bucket stays
the authority; these only spare requests (a HEAD per lookup) and remember
what a LIST found (the index), so that capacity and age can be enforced by
deleting the oldest objects.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator

__all__ = ["CACHE_MAX", "KeyIndex", "PresenceCache"]

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
    """Each stored key's size and last-modified epoch, oldest first; ``used`` sums the sizes."""

    def __init__(self) -> None:
        self._entries: OrderedDict[bytes, tuple[int, float]] = OrderedDict()
        self.used = 0

    @classmethod
    def from_listing(cls, listed: Iterable[tuple[float, str, bytes, int]],
                     cutoff: float | None) -> tuple[KeyIndex, list[bytes]]:
        """An index of what a LIST found (mtime, name, key, size), and the keys older than
        ``cutoff`` it leaves out (None: none are too old)."""
        index, expired = cls(), []
        for mtime, _, key, size in sorted(listed):
            if cutoff is not None and mtime < cutoff:
                expired.append(key)
            else:
                index.add(key, size, mtime)
        return index, expired

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def items(self) -> Iterator[tuple[bytes, tuple[int, float]]]:
        return iter(self._entries.items())

    def add(self, key: bytes, size: int, mtime: float) -> None:
        """Record ``key`` as the newest entry, unless it is there already."""
        if key not in self._entries:
            self._entries[key] = (size, mtime)
            self.used += size

    def forget(self, key: bytes) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.used -= entry[0]

    def trim(self, capacity: int) -> list[bytes]:
        """Drop the oldest entries until ``used`` <= ``capacity``; the keys dropped."""
        dropped = []
        while self.used > capacity and self._entries:
            key, (size, _) = self._entries.popitem(last=False)
            self.used -= size
            dropped.append(key)
        return dropped
