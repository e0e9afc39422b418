"""The host tier's online sizing: miniature simulations estimate other capacities' hit ratios."""

from __future__ import annotations

import itertools
import random

import pytest
from host_blocks import POLICIES, open_host

from kvtier.plan import generate

SIZE = 64


@pytest.mark.parametrize("eviction", POLICIES)
def test_a_full_sample_estimates_other_capacities_exactly(eviction: str) -> None:
    """At sizing_sample 1 each miniature is a tier of that capacity: estimates are its hits."""
    blocks = 300
    tier = open_host(blocks * SIZE, eviction, prefault=0, sizing_sample=1)
    others = {m: open_host(int(blocks * m) * SIZE, eviction, prefault=0, sizing_sample=0)
              for m in (0.5, 1, 2, 4)}
    hits = {m: 0 for m in others}
    gets = 0
    payload = bytes(SIZE)
    for n, request in enumerate(generate("documents", 400, seed=4).requests):
        keys = [key.to_bytes(8, "big") for key in dict.fromkeys(request.keys)]
        tier.get(keys)
        tier.put(keys, [payload] * len(keys), [])
        gets += len(keys) if n else 0  # the miniatures start at the first put
        for m, other in others.items():
            hits[m] += sum(found is not None for found in other.get(keys))
            other.put(keys, [payload] * len(keys), [])
    stats = tier.stats()
    assert stats["sizing_gets"] == gets and stats["sizing_sample"] == 1
    for m in others:
        assert stats[f"sizing_hit_ratio_{m:g}x"] == hits[m] / gets, m
    assert 0 < hits[0.5] < hits[1] < hits[4]


def test_a_sample_of_keys_estimates_near_the_real_ratios() -> None:
    """Zipf(0.9) over 40,000 keys, 10% sampled: each estimate within 2 points of a real tier."""
    blocks, size = 4000, SIZE
    rng = random.Random(3)
    weights = list(itertools.accumulate(1 / (i + 1) ** 0.9 for i in range(40_000)))
    refs = rng.choices(range(40_000), cum_weights=weights, k=100_000)
    tier = open_host(blocks * size, "lru", prefault=0, sizing_sample=0.1)
    others = {m: open_host(int(blocks * m) * size, "lru", prefault=0, sizing_sample=0)
              for m in (0.5, 1, 2, 4)}
    hits = {m: 0 for m in others}
    gets = 0
    payload = bytes(size)
    for start in range(0, len(refs), 16):
        keys = [key.to_bytes(8, "big") for key in dict.fromkeys(refs[start : start + 16])]
        tier.get(keys)
        tier.put(keys, [payload] * len(keys), [])
        gets += len(keys) if start else 0
        for m, other in others.items():
            hits[m] += sum(found is not None for found in other.get(keys))
            other.put(keys, [payload] * len(keys), [])
    stats = tier.stats()
    assert stats["sizing_sample"] == 0.1 and 0 < stats["sizing_gets"] < gets / 5
    for m, hit in hits.items():
        assert abs(stats[f"sizing_hit_ratio_{m:g}x"] - hit / gets) < 0.02, m
    assert hits[0.5] < hits[1] < hits[2] < hits[4]


def test_sizing_sample_zero_turns_it_off_and_small_tiers_raise_the_rate() -> None:
    off = open_host(4096, "lru", prefault=0, sizing_sample=0)
    assert not any(name.startswith("sizing") for name in off.stats())
    small = open_host(100 * SIZE, "lru", prefault=0)  # 100 blocks: every key is sampled
    small.put([b"k"], [bytes(SIZE)], [])
    assert small.stats()["sizing_sample"] == 1.0
