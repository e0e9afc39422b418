"""Online sizing checked against real tiers: key streams, their replay, the tolerance.

``tests/backends/{host,fs,object}/test_sizing.py`` drive a tier that
estimates (``sizing_sample``) and real tiers of the other capacities with the
same batches: each batch a get, then a put, of its keys.  The estimate of a
capacity must be the real tier's hit ratio, within :func:`tolerance`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtier.plan import generate
from kvtier.plugins.registry import BackendHandle

#: Capacities the estimates are reported for, as multiples of the tier's.
MULTIPLES = (0.5, 1, 2, 4)


def document_batches(requests: int, seed: int = 4) -> list[list[bytes]]:
    """The generated ``documents`` trace: each request's keys, once each, as a batch."""
    return [[key.to_bytes(8, "big") for key in dict.fromkeys(request.keys)]
            for request in generate("documents", requests, seed=seed).requests]


def zipf_batches(keys: int, refs: int, batch: int = 16, seed: int = 3) -> list[list[bytes]]:
    """``refs`` references to ``keys`` keys, Zipf(0.9), in batches of distinct keys."""
    rng = random.Random(seed)
    weights = list(itertools.accumulate(1 / (i + 1) ** 0.9 for i in range(keys)))
    drawn = rng.choices(range(keys), cum_weights=weights, k=refs)
    return [[key.to_bytes(8, "big") for key in dict.fromkeys(drawn[start : start + batch])]
            for start in range(0, refs, batch)]


@dataclass
class Replayed:
    """What real tiers made of a key stream: from the miniatures' first put on."""

    gets: int = 0
    hits: dict[float, int] = field(default_factory=dict)
    #: each real tier's misses, per key
    misses: dict[float, Counter[bytes]] = field(default_factory=dict)

    def ratio(self, m: float) -> float:
        return self.hits[m] / self.gets


def replay(tier: BackendHandle, others: Mapping[float, BackendHandle],
           batches: Sequence[Sequence[bytes]], payload: bytes) -> Replayed:
    """Each batch a get then a put on ``tier`` and on each of ``others`` (by multiple).

    The first batch is left out of the counts, as the miniatures start at
    the first put.
    """
    out = Replayed(hits={m: 0 for m in others}, misses={m: Counter() for m in others})
    for n, keys in enumerate(batches):
        blocks = [payload] * len(keys)
        tier.get(keys)
        tier.put(keys, blocks, [])
        for m, other in others.items():
            found = other.get(keys)
            if n:
                out.hits[m] += sum(data is not None for data in found)
                out.misses[m].update(key for key, data in zip(keys, found) if data is None)
            other.put(keys, blocks, [])
        out.gets += len(keys) if n else 0
    return out


def tolerance(sample: float, replayed: Replayed, m: float) -> float:
    """Four standard deviations of the estimate at ``m``, from its sampling of keys.

    A key is in the sample with all its references or not at all, and the
    estimate counts the sampled keys' misses over ``sample`` times the gets
    (SHARDS-adj), so its variance is ``(1 - s) / s x sum(misses_k^2) / gets^2``
    over the real tier's misses of each key: 0 when every key is sampled.
    """
    squares = sum(n * n for n in replayed.misses[m].values())
    return 4 * math.sqrt((1 - sample) / sample * squares) / replayed.gets


def assert_estimates(stats: Mapping[str, Any], replayed: Replayed) -> None:
    """Each ``sizing_hit_ratio_<m>x`` within :func:`tolerance` of the real tier's ratio."""
    for m in replayed.hits:
        estimate, real = stats[f"sizing_hit_ratio_{m:g}x"], replayed.ratio(m)
        allowed = tolerance(stats["sizing_sample"], replayed, m)
        assert abs(estimate - real) <= allowed, (m, estimate, real, allowed)
