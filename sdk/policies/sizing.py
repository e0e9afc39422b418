"""Online sizing: the hit ratio a tier would have at other capacities, while it serves.

SHARDS-style (Waldspurger et al., FAST 2015): keys whose xxh3-64 hash falls
below ``sample`` of the hash space are fed to miniature copies of the tier's
own eviction policy (:mod:`kvtier.policies`), each ``sample`` times
the size of the tier at ½x, 1x, 2x and 4x its capacity.  They hold key and
size only, so their memory is about ``sample x 7.5`` times the tier's block
count in keys.  A hash is the same for every occurrence of a key, so a kept
key keeps all its reuse, and a miniature of ``sample x capacity`` bytes sees
the reuse a tier of ``capacity`` bytes would.  The 1x miniature checks the
estimate against the tier's real hit ratio.

Gets are the references: a get that finds its key in a miniature is a hit
of it, and a put stores the key (a put of a key held is a use), as the host
tier counts.  A miniature of fewer than a few hundred blocks is noisy, so the
rate is raised, for the tier's life, to hold at least :data:`MIN_BLOCKS` of
its first block's size at 1x; the miniatures start at that first put, and
gets before it (misses at any size, the tier being empty) are not counted.

A tier whose gets do not refresh a block (``object`` with ``eviction:
fifo``: the oldest written leaves first) runs ``lru`` miniatures with
``recency=False``: a get or a put of a key held is then no use, and LRU
without uses is FIFO by first store; with ``eviction: s3fifo`` it runs
``s3fifo`` ones.
The ``fs`` and ``object`` tiers decide a put as one batch: the keys held
when it starts are found (and used, on ``fs``) first, and the others enter
after, so that a key held may be pushed out by the batch's new ones
(``by_batch``); the host tier decides key by key.

:class:`Sizing` is what the ``fs`` and ``object`` tiers hold: a sizer with a
lock of its own, or nothing at all when ``sizing_sample`` is 0 or the tier
has no capacity (it never evicts, so every size hits alike).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import xxhash

from kvtier.spec import Option

from .base import Policy
from .registry import new_policy

__all__ = ["MIN_BLOCKS", "MULTIPLIERS", "SIZING_OPTION", "Sizer", "Sizing"]

#: Capacities the miniatures simulate, as multiples of the tier's.
MULTIPLIERS = (0.5, 1.0, 2.0, 4.0)
#: Blocks of its first size the 1x miniature holds at least (raising the rate).
MIN_BLOCKS = 256
_HASH_SPACE = 1 << 64


def _share(value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"must be a share from 0 to 1, got {value}")


#: The option of every tier that evicts (``host``, ``fs``, ``object``).
SIZING_OPTION = Option("float", "Share of keys fed to miniature simulations that estimate "
                       "the hit ratio at 0.5x, 2x and 4x the capacity (stats' "
                       "sizing_hit_ratio_*; 0: off).", default=0.01, check=_share)


def _peek(policy: Policy) -> Callable[[bytes], bool]:
    """Whether ``policy`` holds a key, asked without a use."""
    return lambda key: policy.size(key) is not None


class Sizer:
    """Miniature simulations of one tier; callers serialise the calls (the tier's lock)."""

    def __init__(self, eviction: str, capacity: int, sample: float, *,
                 recency: bool = True, by_batch: bool = False) -> None:
        self.eviction, self.capacity, self.sample = eviction, capacity, sample
        self.recency = recency  # False: gets and puts of a key held are no use (FIFO)
        self.by_batch = by_batch  # a put's keys held at its start are found first
        self._limit = 0
        self._minis: list[Policy] = []
        self._hits = [0] * len(MULTIPLIERS)
        self._gets = 0  # sampled gets
        self._all = 0  # every get since the miniatures started

    def _start(self, size: int) -> None:
        """Size the miniatures once the first block's size is known."""
        wanted = MIN_BLOCKS * max(size, 1) / self.capacity
        self.sample = min(1.0, max(self.sample, wanted))
        self._limit = int(self.sample * _HASH_SPACE)
        self._minis = [new_policy(self.eviction, max(1, int(self.capacity * m * self.sample)))
                       for m in MULTIPLIERS]

    def got(self, keys: Sequence[bytes]) -> None:
        """Gets of ``keys``: the references the hit ratios count."""
        if not self._minis:
            return
        hash_key, limit, hits = xxhash.xxh3_64_intdigest, self._limit, self._hits
        self._all += len(keys)
        for key in keys:
            if hash_key(key) < limit:
                self._gets += 1
                for i, mini in enumerate(self._minis):
                    if (mini.access(key) if self.recency else mini.size(key) is not None):
                        hits[i] += 1

    def stored(self, keys: Sequence[bytes], sizes: Sequence[int], limit: int) -> None:
        """Puts of ``keys`` of ``sizes`` bytes; larger than ``limit``: refused (a key held
        is a use)."""
        if not self._minis and sizes:
            self._start(sizes[0])
        hash_key, sampled = xxhash.xxh3_64_intdigest, self._limit
        picked = [(key, size) for key, size in zip(keys, sizes, strict=True)
                  if size <= limit and hash_key(key) < sampled]
        if not picked:
            return
        for mini in self._minis:
            held = mini.access if self.recency else _peek(mini)
            if self.by_batch:  # the others enter after, so a key held may leave
                for key, size in [(k, s) for k, s in picked if not held(k)]:
                    if size <= mini.capacity:
                        mini.admit(key, size)
                continue
            for key, size in picked:
                if not held(key) and size <= mini.capacity:
                    mini.admit(key, size)

    def stats(self) -> dict[str, float]:
        """``sizing_hit_ratio_<m>x`` per multiplier, the gets they count and the rate.

        SHARDS-adj: a few hot keys carry most hits, and whether each falls in
        the sample moves every estimate alike.  The sampled gets are compared
        with the expected ``sample x gets``, and the difference counted as
        hits (references a hot key would have made) or taken from them
        (figures: BENCHMARKS.md, "Online sizing").
        """
        expected = self._all * self.sample
        deficit = expected - self._gets
        out: dict[str, float] = {
            f"sizing_hit_ratio_{m:g}x": (
                min(1.0, max(0.0, hits + deficit) / expected) if expected else 0.0
            )
            for m, hits in zip(MULTIPLIERS, self._hits, strict=True)
        }
        gets = self._gets
        out["sizing_gets"] = gets
        out["sizing_sample"] = self.sample
        return out


class Sizing:
    """A tier's online sizing, serialised by a lock of its own; a no-op until started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizer: Sizer | None = None

    def start(self, capacity: int | None, sample: float, recency: bool = True,
              eviction: str = "lru") -> None:
        """Miniatures of ``eviction`` of a tier of ``capacity`` bytes (None, or ``sample``
        0: off)."""
        with self._lock:
            self._sizer = (Sizer(eviction, capacity, sample, recency=recency, by_batch=True)
                           if capacity is not None and sample > 0 else None)

    def got(self, keys: Sequence[bytes]) -> None:
        if self._sizer is not None:
            with self._lock:
                if self._sizer is not None:
                    self._sizer.got(keys)

    def stored(self, keys: Sequence[bytes], sizes: Sequence[int]) -> None:
        """Puts of ``keys`` of ``sizes`` bytes; a block over the capacity is refused."""
        if self._sizer is not None:
            with self._lock:
                sizer = self._sizer
                if sizer is not None:
                    sizer.stored(keys, sizes, sizer.capacity)

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {} if self._sizer is None else self._sizer.stats()
