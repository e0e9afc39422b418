"""The fs tier's online sizing: estimates of other capacities against real fs tiers of them."""

from __future__ import annotations

from pathlib import Path

from fs_blocks import Opener
from sizing_replay import MULTIPLES, assert_estimates, document_batches, replay, zipf_batches

SIZE = 64


def test_a_full_sample_estimates_other_capacities_exactly(opener: Opener, tmp_path: Path) -> None:
    """At sizing_sample 1 each miniature is an fs tier of that capacity, LRU as its index
    (``pool: false``: the shared pool orders a batch's blocks among themselves its own way)."""
    blocks = 150
    tier = opener(f"file://{tmp_path}/tier", capacity=blocks * SIZE, sizing_sample=1,
                  pool=False)
    others = {m: opener(f"file://{tmp_path}/{m}", capacity=int(blocks * m) * SIZE,
                        sizing_sample=0, pool=False) for m in MULTIPLES}
    real = replay(tier, others, document_batches(150), bytes(SIZE))
    stats = tier.stats()
    assert stats["sizing_gets"] == real.gets and stats["sizing_sample"] == 1
    for m in others:
        assert stats[f"sizing_hit_ratio_{m:g}x"] == real.ratio(m), m
    assert 0 < real.hits[0.5] < real.hits[1] < real.hits[2] < real.hits[4]
    assert not any(name.startswith("sizing") for name in others[1].stats())


def test_a_sample_of_keys_estimates_near_the_real_ratios(opener: Opener, tmp_path: Path) -> None:
    """Zipf(0.9), 30% of the keys sampled: within the sample's tolerance of real tiers
    (on the shared pool, as a local root with a capacity has by default).  Blocks of
    1 KiB: the pool's capacity counts its own files beyond 512 KiB, its index among
    them (about 200 bytes a block), which would outweigh blocks of 64 bytes."""
    blocks, size = 1000, 16 * SIZE
    tier = opener(f"file://{tmp_path}/tier", capacity=blocks * size, sizing_sample=0.3,
                  io_threads=1)
    others = {m: opener(f"file://{tmp_path}/{m}", capacity=int(blocks * m) * size,
                        sizing_sample=0, io_threads=1) for m in (0.5, 2)}
    real = replay(tier, others, zipf_batches(4_000, 8_000), bytes(size))
    stats = tier.stats()
    assert stats["sizing_sample"] == 0.3 and 0 < stats["sizing_gets"] < real.gets / 2
    assert_estimates(stats, real)
    assert real.hits[0.5] < real.hits[2]


def test_no_capacity_or_sample_zero_estimates_nothing(opener: Opener, tmp_path: Path) -> None:
    for tier in (opener(f"file://{tmp_path}/a"), opener(f"file://{tmp_path}/b",
                                                        capacity=1 << 20, sizing_sample=0)):
        tier.put([b"k"], [bytes(SIZE)], [])
        assert not any(name.startswith("sizing") for name in tier.stats())
