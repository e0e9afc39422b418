"""``eviction: adaptive``: follows whichever fixed policy hits most on the recent traffic.

The candidates are :mod:`.lru`, :mod:`.arc` and :mod:`.s3fifo`.  How it
chooses, and the figures behind its constants, are in :class:`Adaptive` and
BENCHMARKS.md ("adaptive beside the best fixed policy").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import xxhash

from .arc import Arc
from .lru import Lru
from .s3fifo import S3Fifo

__all__ = ["Adaptive"]

_EVERY_KEY = 1 << 64  # a sample limit that takes every key


def _hash64(key: bytes | int) -> int:
    """A key's 64-bit hash, the same in every process (plan replays int keys)."""
    if isinstance(key, int):  # splitmix64's finaliser
        z = (key + 0x9E3779B97F4A7C15) & 0xFFFF_FFFF_FFFF_FFFF
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFF_FFFF_FFFF_FFFF
        return z ^ (z >> 31)
    return xxhash.xxh3_64_intdigest(key)


class Adaptive:
    """Follows whichever of lru, arc and s3fifo hits most on the recent traffic.

    Keys sampled by hash (at least :data:`SAMPLE`, raised so a miniature holds
    :data:`MIN_BLOCKS` blocks of the first block's size) feed a miniature of
    each candidate at the tier's capacity scaled by the sample, as in online
    sizing; every access and admit is a reference for them.  It starts with
    ``s3fifo`` (started with ``lru``, it lagged where a trace ended before the
    evidence for a frequency-aware policy piled up: 1.8 points behind at
    20,000 blocks of Mooncake's synthetic trace, BENCHMARKS.md) and every
    :data:`CHECK` sampled uses switches to a candidate that hits more by over
    :data:`Z` standard deviations of the uses where the two disagree
    (McNemar's test: uses both hit or both miss tell nothing).  A fixed 2%
    margin kept the first policy for a whole trace where differences were
    small beside the hits, and switched on noise where hits were few
    (BENCHMARKS.md, "adaptive beside the best fixed policy").  Hits and
    disagreements are halved every :data:`EPOCH` sampled uses.

    An engine is served prefixes, not blocks: a hit after a prompt's first
    miss saves nothing.  Where the miniatures see every key (a tier of up to
    :data:`MIN_BLOCKS` blocks), they score as the engine is served: a lookup
    (:meth:`holds`) begins a request, and a miniature's hits after its first
    miss in it do not count.  Scored by blocks, ARC and S3-FIFO tied on a
    20-block tier under scans where ARC served a third more prefixes, and
    adaptive wavered between them, up to 2 points behind ARC.  With fewer
    keys sampled a miniature cannot know a request's other blocks, and
    scores blocks.

    A switch hands the blocks on in the order the old policy would evict
    them, each used again as often (up to 3) as while held, so the successor
    keeps blocks used again apart (ARC's T2, S3-FIFO's main queue); handed on
    as new, they lost most of what a switch would gain.
    """

    name: ClassVar[str] = "adaptive"
    CANDIDATES: ClassVar[tuple[type[Lru | Arc | S3Fifo], ...]] = (Lru, Arc, S3Fifo)
    FIRST = S3Fifo
    SAMPLE = 0.01
    #: Blocks a miniature holds at least (of the first block's size): the sample is raised to it.
    MIN_BLOCKS = 256
    CHECK = 100
    EPOCH = 2000
    Z = 2.0
    #: Uses of a block a switch hands on at most, as S3-FIFO's counts.
    MAX_USES = 3

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.leader = self.CANDIDATES.index(self.FIRST)
        self._policy: Lru | Arc | S3Fifo = self.FIRST(capacity)
        self._earlier_evictions = 0
        self._limit = 0
        self._minis: list[Lru | Arc | S3Fifo] = []
        n = len(self.CANDIDATES)
        self._scores = [0.0] * n
        self._apart = [[0.0] * n for _ in range(n)]  # [i][j]: uses i hit and j missed
        self._uses = 0
        self.switches = 0
        self._reused: dict[bytes, int] = {}  # uses of blocks held since their admit, up to 3
        # per miniature, whether it held every key of the current request so far; None until
        # a lookup marks a request's start where the miniatures see every key
        self._leading: list[bool] | None = None

    @property
    def used(self) -> int:
        return self._policy.used

    @property
    def evictions(self) -> int:
        return self._earlier_evictions + self._policy.evictions

    def __len__(self) -> int:
        return len(self._policy)

    def size(self, key: bytes) -> int | None:
        return self._policy.size(key)

    def held(self) -> list[tuple[bytes, int]]:
        return self._policy.held()

    def holds(self, keys: Sequence[bytes]) -> list[bool]:
        if self._limit >= _EVERY_KEY:  # a lookup begins a request: score its prefix
            self._leading = [True] * len(self.CANDIDATES)
        return self._policy.holds(keys)

    def remove(self, key: bytes) -> bool:
        self._reused.pop(key, None)
        return self._policy.remove(key)

    def resize(self, key: bytes, size: int) -> None:
        self._policy.resize(key, size)

    def enter(self, key: bytes, size: int) -> None:
        self._reused.pop(key, None)
        self._policy.enter(key, size)

    def shed(self) -> list[bytes]:
        return self._forget(self._policy.shed())

    def make_room(self, nbytes: int) -> list[bytes]:
        return self._forget(self._policy.make_room(nbytes))

    def stats(self) -> dict[str, int]:
        return {"adaptive_leader": self.leader, "adaptive_switches": self.switches}

    def access(self, key: bytes) -> bool:
        if self._minis and _hash64(key) < self._limit:
            self._sampled_use(key)
        if not self._policy.access(key):
            return False
        reused = self._reused
        uses = reused.get(key, 0)
        if uses < self.MAX_USES:
            reused[key] = uses + 1
        return True

    def admit(self, key: bytes, size: int) -> list[bytes]:
        if not self._minis:
            sample = min(1.0, max(self.SAMPLE, self.MIN_BLOCKS * max(size, 1) / self.capacity))
            self._limit = int(sample * (1 << 64))
            mini_capacity = max(1, int(self.capacity * sample))
            self._minis = [policy(mini_capacity) for policy in self.CANDIDATES]
        if _hash64(key) < self._limit:
            for mini in self._minis:
                if not mini.access(key) and size <= mini.capacity:
                    mini.admit(key, size)
        self._reused.pop(key, None)  # a block admitted anew has not been used again yet
        victims = self._forget(self._policy.admit(key, size))
        reused = self._reused
        if len(reused) > 2 * len(self._policy):  # left over by a policy's own removals
            held = self._policy.holds(list(reused))
            self._reused = {k: n for (k, n), keep in zip(reused.items(), held, strict=True)
                            if keep}
        return victims

    def _forget(self, victims: list[bytes]) -> list[bytes]:
        """Drop the use counts of ``victims``, which left."""
        reused = self._reused
        for gone in victims:
            reused.pop(gone, None)
        return victims

    def _sampled_use(self, key: bytes) -> None:
        hit = [mini.access(key) for mini in self._minis]
        leading = self._leading
        if leading is not None:  # a hit after the miniature's first miss is no prefix hit
            hit = [one and lead for one, lead in zip(hit, leading, strict=True)]
            self._leading = hit
        scores, apart = self._scores, self._apart
        for i, one in enumerate(hit):
            if one:
                scores[i] += 1
                row = apart[i]
                for j, other in enumerate(hit):
                    if not other:
                        row[j] += 1
        self._uses += 1
        if self._uses % self.CHECK == 0:
            self._decide()

    def _decide(self) -> None:
        scores, apart, lead = self._scores, self._apart, self.leader
        best = max(range(len(scores)), key=scores.__getitem__)
        disagree = apart[best][lead] + apart[lead][best]
        if best != lead and scores[best] - scores[lead] > self.Z * disagree ** 0.5:
            self._switch(best)
        if self._uses >= self.EPOCH:
            self._scores = [score / 2 for score in scores]
            self._apart = [[n / 2 for n in row] for row in apart]
            self._uses = 0

    def _switch(self, to: int) -> None:
        successor = self.CANDIDATES[to](self.capacity)
        reused = self._reused
        for key, size in self._policy.held():
            successor.admit(key, size)  # the same bytes fit the same capacity
            for _ in range(reused.get(key, 0)):  # at the newest end: the order holds
                successor.access(key)
        self._earlier_evictions += self._policy.evictions
        self._policy, self.leader = successor, to
        self.switches += 1
