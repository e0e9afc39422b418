"""``arc``: the Adaptive Replacement Cache of Megiddo and Modha (FAST 2003), in bytes.

KV prefix blocks defeat LRU: a few blocks (system prompts, shared prefixes)
are reused constantly while long one-off contexts stream through once, and a
scan larger than the tier flushes the reused blocks.  ARC keeps blocks seen
once (T1) apart from blocks seen at least twice (T2); a scan only churns T1,
so the hot prefixes in T2 survive it, and ARC still adapts when the recency
side deserves more room.

The paper counts equal-sized pages; blocks vary, so everything here is bytes:

* T1 + T2 hold the blocks; their byte sum is ``used`` <= ``capacity``.
* Ghost lists B1 and B2 keep key and size of blocks evicted from T1 and T2,
  trimmed so ``T1 + B1 <= capacity`` and ``B1 + B2 <= capacity``: the byte
  form of ``|L1| <= c`` and ``|L1| + |L2| <= 2c``.  A ghost weighs at least
  one byte so empty blocks cannot grow the ghost lists without bound.
* ``p`` (``arc_p`` in stats) is T1's target size in bytes, in [0, capacity].
  An admit of a key found in B1 means T1 was too small: ``p`` grows by the
  ghost's size times ``max(1, B2/B1)``, the paper's ``max(1, |B2|/|B1|)``
  pages scaled by the size of the block that would have hit.  A B2 ghost hit
  shrinks ``p`` the same way.  Either way the key re-enters at T2.
* REPLACE evicts T1's oldest while T1 holds more than ``p`` bytes (or exactly
  ``p`` on a B2 ghost hit), else T2's oldest, repeated until the new block
  fits: one large block may displace several small ones.

With equal block sizes this makes exactly the paper's decisions (the tests
check it against a transcription of the paper's four cases).  A ``remove``
(an explicit ``kvtier_evict``) leaves no ghost: the caller asked for it, so
it says nothing about the cache being too small.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .base import Accounting, Ghosts

__all__ = ["Arc"]


class Arc(Accounting):
    """T1 (seen once) and T2 (seen again), their ghosts B1 and B2, and T1's target ``p``."""

    name = "arc"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._t1: OrderedDict[bytes, int] = OrderedDict()
        self._t2: OrderedDict[bytes, int] = OrderedDict()
        self._t1_bytes = 0  # T2's bytes are used - _t1_bytes
        self._b1 = Ghosts()
        self._b2 = Ghosts()
        self.p = 0

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def holds(self, keys: Sequence[bytes]) -> list[bool]:
        t1, t2 = self._t1, self._t2
        return [key in t1 or key in t2 for key in keys]

    def size(self, key: bytes) -> int | None:
        size = self._t1.get(key)
        return size if size is not None else self._t2.get(key)

    def held(self) -> list[tuple[bytes, int]]:
        return [*self._t1.items(), *self._t2.items()]

    def access(self, key: bytes) -> bool:
        size = self._t1.pop(key, None)
        if size is not None:
            self._t1_bytes -= size
            self._t2[key] = size
            return True
        t2 = self._t2
        if key in t2:
            t2.move_to_end(key)
            return True
        return False

    def admit(self, key: bytes, size: int) -> list[bytes]:
        ghost = self._ghost_hit(key)
        victims: list[bytes] = []
        if self.used + size > self.capacity:
            hit_b2 = ghost is self._b2
            while self.used + size > self.capacity:
                victims.append(self._replace(hit_b2))
            self.evictions += len(victims)
        self._insert(key, size, ghost is not None)
        return victims

    def enter(self, key: bytes, size: int) -> None:
        self._insert(key, size, self._ghost_hit(key) is not None)

    def remove(self, key: bytes) -> bool:
        size = self._t1.pop(key, None)
        if size is not None:
            self._t1_bytes -= size
        else:
            size = self._t2.pop(key, None)
            if size is None:
                return False
        self.used -= size
        return True

    def resize(self, key: bytes, size: int) -> None:
        old = self._t1.get(key)
        if old is not None:
            self._t1[key] = size
            self._t1_bytes += size - old
        else:
            old = self._t2[key]
            self._t2[key] = size
        self.used += size - old

    def stats(self) -> dict[str, int]:
        return {"arc_p": self.p}

    def _ghost_hit(self, key: bytes) -> Ghosts | None:
        """Adapt ``p`` to a ghost of ``key`` and drop it; the ghost list it was in, or None."""
        b1, b2 = self._b1, self._b2
        if key not in b1.keys and key not in b2.keys:
            return None
        weight = b1.keys.get(key)
        if weight is not None:
            # b1.bytes >= weight >= 1 here, so the divisions are safe
            step = weight if b1.bytes >= b2.bytes else weight * b2.bytes // b1.bytes
            self.p = min(self.capacity, self.p + step)
            b1.discard(key)
            return b1
        weight = b2.keys.get(key)
        if weight is not None:
            step = weight if b2.bytes >= b1.bytes else weight * b1.bytes // b2.bytes
            self.p = max(0, self.p - step)
            b2.discard(key)
            return b2
        return None

    def _insert(self, key: bytes, size: int, ghost: bool) -> None:
        if ghost:
            self._t2[key] = size
        else:
            self._t1[key] = size
            self._t1_bytes += size
        self.used += size
        self._trim()

    def _evict_one(self) -> bytes:
        return self._replace(False)

    def _replace(self, hit_b2: bool) -> bytes:
        t1_bytes = self._t1_bytes
        from_t1 = bool(self._t1) and (
            not self._t2 or t1_bytes > self.p or (hit_b2 and t1_bytes >= self.p)
        )
        if from_t1:
            key, size = self._t1.popitem(last=False)
            self._t1_bytes -= size
            self._b1.add(key, size)
        else:
            key, size = self._t2.popitem(last=False)
            self._b2.add(key, size)
        self.used -= size
        return key

    def _trim(self) -> None:
        b1, b2 = self._b1, self._b2
        while b1.keys and self._t1_bytes + b1.bytes > self.capacity:
            b1.drop_oldest()
        while b1.bytes + b2.bytes > self.capacity:
            # the paper drops B2's oldest first when the directory is full
            (b2 if b2.keys else b1).drop_oldest()
