"""``lru``: the least recently used block leaves first.

The host tier's default, the fs tier's (its own index, and the pool's SQL
order by last use), and, with uses not counted, the object tier's ``fifo``
(sizing runs it so, :mod:`.sizing`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .base import Accounting

__all__ = ["Lru"]


class Lru(Accounting):
    """Keys by last use, least recent first; a use moves a key to the newest end."""

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._sizes: OrderedDict[bytes, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sizes)

    def holds(self, keys: Sequence[bytes]) -> list[bool]:
        sizes = self._sizes  # `in` on the dict: no method call per key
        return [key in sizes for key in keys]

    def size(self, key: bytes) -> int | None:
        return self._sizes.get(key)

    def held(self) -> list[tuple[bytes, int]]:
        return list(self._sizes.items())

    def access(self, key: bytes) -> bool:
        sizes = self._sizes
        if key in sizes:  # not try/except: a miss (every put of a new key) raising costs more
            sizes.move_to_end(key)
            return True
        return False

    def admit(self, key: bytes, size: int) -> list[bytes]:
        # Accounting's, with enter inlined: the host tier's default put path
        victims = (self._evict_until(self.capacity - size)
                   if self.used + size > self.capacity else [])
        self._sizes[key] = size
        self.used += size
        return victims

    def enter(self, key: bytes, size: int) -> None:
        self._sizes[key] = size
        self.used += size

    def remove(self, key: bytes) -> bool:
        size = self._sizes.pop(key, None)
        if size is None:
            return False
        self.used -= size
        return True

    def resize(self, key: bytes, size: int) -> None:
        self.used += size - self._sizes[key]
        self._sizes[key] = size

    def _evict_until(self, budget: int) -> list[bytes]:
        # Accounting's, with _evict_one inlined: a put into a full tier runs it
        sizes, victims = self._sizes, []
        while self.used > budget:
            key, size = sizes.popitem(last=False)
            self.used -= size
            victims.append(key)
        self.evictions += len(victims)
        return victims

    def _evict_one(self) -> bytes:
        key, size = self._sizes.popitem(last=False)
        self.used -= size
        return key
