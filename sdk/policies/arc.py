"""The fixed eviction policies, ``lru``, ``arc`` and ``s3fifo``: what a tier drops, and when.

:mod:`kvtier.backends.eviction` names every policy and builds one by name
(``adaptive``, :mod:`kvtier.backends.adaptive`, is built on these); the host
tier holds one (``eviction`` option), and ``kvtier plan`` replays traces
through the same objects.  Each counts bytes: ``admit``
a key not held, ``access`` (a use), ``holds`` (not a use), ``peek``,
``remove``, ``rewrite``, ``shed`` and ``make_room``; callers serialise the
calls.

``lru`` drops the least recently used block.  ``arc`` is the Adaptive
Replacement Cache of Megiddo and Modha (FAST 2003).  KV prefix blocks defeat
LRU: a few blocks (system prompts, shared prefixes) are reused constantly while
long one-off contexts stream through once, and a scan larger than the tier
flushes the reused blocks.  ARC keeps blocks seen once (T1) apart from blocks
seen at least twice (T2); a scan only churns T1, so the hot prefixes in T2
survive it, and ARC still adapts when the recency side deserves more room.

The paper counts equal-sized pages; blocks vary, so everything here is bytes:

* T1 + T2 hold the blocks; their byte sum is ``used_bytes`` <= ``capacity``.
* Ghost lists B1 and B2 keep key and size (no data) of blocks evicted from T1
  and T2, trimmed so ``T1 + B1 <= capacity`` and ``B1 + B2 <= capacity``: the
  byte form of ``|L1| <= c`` and ``|L1| + |L2| <= 2c``.  A ghost weighs at
  least one byte so empty blocks cannot grow the ghost lists without bound.
* ``p`` (``arc_p`` in stats) is T1's target size in bytes, in [0, capacity].
  A ``put`` of a key found in B1 means T1 was too small: ``p`` grows by the
  ghost's size times ``max(1, B2/B1)``, the paper's ``max(1, |B2|/|B1|)``
  pages scaled by the size of the block that would have hit.  A B2 ghost hit
  shrinks ``p`` the same way.  Either way the key re-enters at T2.
* REPLACE evicts T1's oldest while T1 holds more than ``p`` bytes (or exactly
  ``p`` on a B2 ghost hit), else T2's oldest, repeated until the new block
  fits: one large block may displace several small ones.

With equal block sizes this makes exactly the paper's decisions (the tests
check it against a transcription of the paper's four cases).

``s3fifo`` is S3-FIFO (Yang et al., SOSP 2023), frequency-aware: blocks used
once leave from a small queue, blocks used again live in a main one
(:class:`S3Fifo`).  ``adaptive`` runs the three as miniatures on sampled keys
and follows the one that hits most (:mod:`kvtier.backends.adaptive`).
``kvtier plan`` compares them on a trace (docs/sizing.md).

An explicit ``kvtier_evict`` leaves no ghost: the caller asked for it, so it
says nothing about the cache being too small.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import cast

from kvtier.spec.base import Evicted

__all__ = ["FIXED_POLICIES", "Accounting", "Arc", "Lru", "S3Fifo", "Sized", "stand_in"]


class Accounting:
    """Byte accounting shared by the policies.

    Callers hold the backend's lock, and only admit a key that is not resident
    with ``len(data) <= capacity``.  ``peek`` is not a use, ``access`` is;
    ``rewrite`` swaps a block's bytes keeping its place; ``shed`` evicts until
    the capacity holds again after a rewrite grew a block.  ``make_room(n)``
    evicts, in the policy's order, until ``n`` bytes fewer are used, whatever
    the capacity: a cache that owns its capacity itself (vLLM's CPU tier,
    :mod:`kvtier.contrib.vllm.cache_policy`) asks for its victims this way,
    then admits.  Ghost lists are trimmed by that ``admit``, after it looked
    its key up among them, as when ``admit`` evicts itself.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.evictions = 0

    def extra_stats(self) -> dict[str, int]:
        return {}


class Lru(Accounting):
    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._blocks: OrderedDict[bytes, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def peek(self, key: bytes) -> bytes | None:
        return self._blocks.get(key)

    def sizes(self) -> list[tuple[bytes, int]]:
        return [(key, len(data)) for key, data in self._blocks.items()]

    def items(self) -> list[tuple[bytes, bytes]]:
        """Blocks held, the first to leave first (as an adaptive policy hands them on)."""
        return list(self._blocks.items())

    def holds(self, keys: Sequence[bytes]) -> list[bool]:
        blocks = self._blocks  # `in` on the dict: no method call per key
        return [key in blocks for key in keys]

    def access(self, key: bytes) -> bytes | None:
        data = self._blocks.get(key)
        if data is not None:
            self._blocks.move_to_end(key)
        return data

    def admit(self, key: bytes, data: bytes, evicted: Evicted) -> None:
        self._evict_until(self.capacity - len(data), evicted)
        self._blocks[key] = data
        self.used += len(data)

    def remove(self, key: bytes) -> bytes | None:
        data = self._blocks.pop(key, None)
        if data is not None:
            self.used -= len(data)
        return data

    def rewrite(self, key: bytes, data: bytes) -> None:
        self.used += len(data) - len(self._blocks[key])
        self._blocks[key] = data

    def shed(self, evicted: Evicted) -> None:
        self._evict_until(self.capacity, evicted)

    def make_room(self, nbytes: int, evicted: Evicted) -> None:
        self._evict_until(max(0, self.used - nbytes), evicted)

    def _evict_until(self, budget: int, evicted: Evicted) -> None:
        while self.used > budget:
            key, data = self._blocks.popitem(last=False)
            self.used -= len(data)
            self.evictions += 1
            evicted.append((key, data))


class Ghosts:
    """Keys and byte weights of blocks evicted from one ARC list, oldest first."""

    __slots__ = ("bytes", "keys")

    def __init__(self) -> None:
        self.keys: OrderedDict[bytes, int] = OrderedDict()
        self.bytes = 0

    def add(self, key: bytes, size: int) -> None:
        weight = max(size, 1)
        self.keys[key] = weight
        self.bytes += weight

    def discard(self, key: bytes) -> None:
        self.bytes -= self.keys.pop(key, 0)

    def drop_oldest(self) -> None:
        self.bytes -= self.keys.popitem(last=False)[1]


class Arc(Accounting):
    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._t1: OrderedDict[bytes, bytes] = OrderedDict()
        self._t2: OrderedDict[bytes, bytes] = OrderedDict()
        self._t1_bytes = 0  # T2's bytes are used - _t1_bytes
        self._b1 = Ghosts()
        self._b2 = Ghosts()
        self.p = 0

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def peek(self, key: bytes) -> bytes | None:
        data = self._t1.get(key)
        return data if data is not None else self._t2.get(key)

    def sizes(self) -> list[tuple[bytes, int]]:
        return [(key, len(data)) for key, data in self.items()]

    def items(self) -> list[tuple[bytes, bytes]]:
        return [*self._t1.items(), *self._t2.items()]

    def holds(self, keys: Sequence[bytes]) -> list[bool]:
        t1, t2 = self._t1, self._t2
        return [key in t1 or key in t2 for key in keys]

    def access(self, key: bytes) -> bytes | None:
        data = self._t1.pop(key, None)
        if data is not None:
            self._t1_bytes -= len(data)
            self._t2[key] = data
            return data
        data = self._t2.get(key)
        if data is not None:
            self._t2.move_to_end(key)
        return data

    def admit(self, key: bytes, data: bytes, evicted: Evicted) -> None:
        b1, b2 = self._b1, self._b2
        hit_b2 = False
        weight = b1.keys.get(key)
        if weight is not None:
            # b1.bytes >= weight >= 1 here, so the divisions are safe
            step = weight if b1.bytes >= b2.bytes else weight * b2.bytes // b1.bytes
            self.p = min(self.capacity, self.p + step)
            b1.discard(key)
        else:
            weight = b2.keys.get(key)
            if weight is not None:
                step = weight if b2.bytes >= b1.bytes else weight * b1.bytes // b2.bytes
                self.p = max(0, self.p - step)
                b2.discard(key)
                hit_b2 = True
        while self.used + len(data) > self.capacity:
            self._replace(hit_b2, evicted)
        if weight is None:
            self._t1[key] = data
            self._t1_bytes += len(data)
        else:
            self._t2[key] = data
        self.used += len(data)
        self._trim_ghosts()

    def remove(self, key: bytes) -> bytes | None:
        data = self._t1.pop(key, None)
        if data is not None:
            self._t1_bytes -= len(data)
        else:
            data = self._t2.pop(key, None)
        if data is not None:
            self.used -= len(data)
        return data

    def rewrite(self, key: bytes, data: bytes) -> None:
        old = self._t1.get(key)
        if old is not None:
            self._t1[key] = data
            self._t1_bytes += len(data) - len(old)
        else:
            old = self._t2[key]
            self._t2[key] = data
        self.used += len(data) - len(old)

    def shed(self, evicted: Evicted) -> None:
        while self.used > self.capacity:
            self._replace(False, evicted)
        self._trim_ghosts()

    def make_room(self, nbytes: int, evicted: Evicted) -> None:
        target = max(0, self.used - nbytes)
        while self.used > target:
            self._replace(False, evicted)

    def extra_stats(self) -> dict[str, int]:
        return {"arc_p": self.p}

    def _replace(self, hit_b2: bool, evicted: Evicted) -> None:
        t1_bytes = self._t1_bytes
        from_t1 = bool(self._t1) and (
            not self._t2 or t1_bytes > self.p or (hit_b2 and t1_bytes >= self.p)
        )
        if from_t1:
            key, data = self._t1.popitem(last=False)
            self._t1_bytes -= len(data)
            self._b1.add(key, len(data))
        else:
            key, data = self._t2.popitem(last=False)
            self._b2.add(key, len(data))
        self.used -= len(data)
        self.evictions += 1
        evicted.append((key, data))

    def _trim_ghosts(self) -> None:
        b1, b2 = self._b1, self._b2
        while b1.keys and self._t1_bytes + b1.bytes > self.capacity:
            b1.drop_oldest()
        while b1.bytes + b2.bytes > self.capacity:
            # the paper drops B2's oldest first when the directory is full
            (b2 if b2.keys else b1).drop_oldest()


class S3Fifo(Accounting):
    """S3-FIFO (Yang et al., SOSP 2023): three FIFO queues, in bytes.

    A new block enters the small queue S (a tenth of the capacity); a key
    found among the ghosts G enters the main queue M instead.  Each use
    raises a block's count, at most 3, and moves nothing.  To make room, S's
    oldest goes to M if it was used again while in S, else it is evicted and
    its key joins G (keys only, at most M's share of the capacity); when S is
    within its share, M's oldest is reinserted with its count lowered while
    the count is above 0, else evicted.  Most KV blocks are used once (the
    tail of a one-off prompt): they leave from S after a tenth of the
    capacity, while blocks seen twice live in M.
    """

    #: S's share of the capacity, as the paper's 10%.
    SMALL_DIVISOR = 10
    #: Highest use count, as the paper's two bits.
    MAX_FREQ = 3

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._small: OrderedDict[bytes, bytes] = OrderedDict()
        self._main: OrderedDict[bytes, bytes] = OrderedDict()
        self._small_bytes = 0
        self._small_target = max(1, capacity // self.SMALL_DIVISOR)
        self._freq: dict[bytes, int] = {}
        self._ghosts = Ghosts()

    def __len__(self) -> int:
        return len(self._small) + len(self._main)

    def peek(self, key: bytes) -> bytes | None:
        data = self._small.get(key)
        return data if data is not None else self._main.get(key)

    def sizes(self) -> list[tuple[bytes, int]]:
        return [(key, len(data)) for key, data in self.items()]

    def items(self) -> list[tuple[bytes, bytes]]:
        return [*self._small.items(), *self._main.items()]

    def holds(self, keys: Sequence[bytes]) -> list[bool]:
        small, main = self._small, self._main
        return [key in small or key in main for key in keys]

    def access(self, key: bytes) -> bytes | None:
        data = self._small.get(key)
        if data is None:
            data = self._main.get(key)
            if data is None:
                return None
        freq = self._freq[key]
        if freq < self.MAX_FREQ:
            self._freq[key] = freq + 1
        return data

    def admit(self, key: bytes, data: bytes, evicted: Evicted) -> None:
        while self.used + len(data) > self.capacity:
            self._evict_one(evicted)
        self.enter(key, data)

    def enter(self, key: bytes, data: bytes) -> None:
        """Hold ``key`` without making room: a block known stored (found on disk, listed)
        or one the caller made room for; over the capacity until ``shed`` or an admit."""
        if key in self._ghosts.keys:
            self._ghosts.discard(key)
            self._main[key] = data
        else:
            self._small[key] = data
            self._small_bytes += len(data)
        self._freq[key] = 0
        self.used += len(data)
        self._trim_ghosts()

    def remove(self, key: bytes) -> bytes | None:
        data = self._small.pop(key, None)
        if data is not None:
            self._small_bytes -= len(data)
        else:
            data = self._main.pop(key, None)
        if data is not None:
            self.used -= len(data)
            del self._freq[key]
        return data

    def rewrite(self, key: bytes, data: bytes) -> None:
        old = self._small.get(key)
        if old is not None:
            self._small[key] = data
            self._small_bytes += len(data) - len(old)
        else:
            old = self._main[key]
            self._main[key] = data
        self.used += len(data) - len(old)

    def shed(self, evicted: Evicted) -> None:
        while self.used > self.capacity:
            self._evict_one(evicted)
        self._trim_ghosts()

    def make_room(self, nbytes: int, evicted: Evicted) -> None:
        target = max(0, self.used - nbytes)
        while self.used > target:
            self._evict_one(evicted)

    def extra_stats(self) -> dict[str, int]:
        return {"s3fifo_small_bytes": self._small_bytes}

    def _evict_one(self, evicted: Evicted) -> None:
        """One step of the paper's EVICT: a block moved or reinserted, or one evicted."""
        if self._small and (self._small_bytes >= self._small_target or not self._main):
            key, data = self._small.popitem(last=False)
            self._small_bytes -= len(data)
            if self._freq[key] > 0:  # used again while in S: worth a place in M
                self._freq[key] = 0
                self._main[key] = data
                return
            self._ghosts.add(key, len(data))
        else:
            key, data = self._main.popitem(last=False)
            freq = self._freq[key]
            if freq > 0:
                self._freq[key] = freq - 1
                self._main[key] = data
                return
        del self._freq[key]
        self.used -= len(data)
        self.evictions += 1
        evicted.append((key, data))

    def _trim_ghosts(self) -> None:
        ghosts, limit = self._ghosts, self.capacity - self._small_target
        while ghosts.keys and ghosts.bytes > limit:
            ghosts.drop_oldest()


class Sized:
    """A payload that is a length and nothing else: miniatures and replays store it."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def stand_in(size: int) -> bytes:
    """A payload of ``size`` bytes that is its length only, typed as the policies' payloads:
    a tier that keeps its blocks elsewhere (on disk, in a bucket) accounts them with it."""
    return cast(bytes, Sized(size))


#: The fixed policies, by name; ``adaptive`` (:mod:`.adaptive`) chooses among them.
FIXED_POLICIES: Mapping[str, Callable[[int], Lru | Arc | S3Fifo]] = {
    "lru": Lru, "arc": Arc, "s3fifo": S3Fifo,
}
