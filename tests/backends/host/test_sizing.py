"""The host tier's online sizing: miniature simulations estimate other capacities' hit ratios."""

from __future__ import annotations

import pytest
from host_blocks import POLICIES, open_host
from sizing_replay import (
    MULTIPLES,
    assert_estimates,
    document_batches,
    replay,
    zipf_batches,
)

SIZE = 64


@pytest.mark.parametrize("eviction", POLICIES)
def test_a_full_sample_estimates_other_capacities_exactly(eviction: str) -> None:
    """At sizing_sample 1 each miniature is a tier of that capacity: estimates are its hits."""
    blocks = 300
    tier = open_host(blocks * SIZE, eviction, prefault=0, sizing_sample=1)
    others = {m: open_host(int(blocks * m) * SIZE, eviction, prefault=0, sizing_sample=0)
              for m in MULTIPLES}
    real = replay(tier, others, document_batches(400), bytes(SIZE))
    stats = tier.stats()
    assert stats["sizing_gets"] == real.gets and stats["sizing_sample"] == 1
    for m in others:
        assert stats[f"sizing_hit_ratio_{m:g}x"] == real.ratio(m), m
    assert 0 < real.hits[0.5] < real.hits[1] < real.hits[4]


def test_a_sample_of_keys_estimates_near_the_real_ratios() -> None:
    """Zipf(0.9) over 40,000 keys, 10% sampled: each estimate within 2 points of a real tier."""
    blocks = 4000
    tier = open_host(blocks * SIZE, "lru", prefault=0, sizing_sample=0.1)
    others = {m: open_host(int(blocks * m) * SIZE, "lru", prefault=0, sizing_sample=0)
              for m in MULTIPLES}
    real = replay(tier, others, zipf_batches(40_000, 100_000), bytes(SIZE))
    stats = tier.stats()
    assert stats["sizing_sample"] == 0.1 and 0 < stats["sizing_gets"] < real.gets / 5
    assert_estimates(stats, real)
    for m in others:  # the tolerance is a few points here, and the estimates closer still
        assert abs(stats[f"sizing_hit_ratio_{m:g}x"] - real.ratio(m)) < 0.02, m
    assert real.hits[0.5] < real.hits[1] < real.hits[2] < real.hits[4]


def test_sizing_sample_zero_turns_it_off_and_small_tiers_raise_the_rate() -> None:
    off = open_host(4096, "lru", prefault=0, sizing_sample=0)
    assert not any(name.startswith("sizing") for name in off.stats())
    small = open_host(100 * SIZE, "lru", prefault=0)  # 100 blocks: every key is sampled
    small.put([b"k"], [bytes(SIZE)], [])
    assert small.stats()["sizing_sample"] == 1.0
