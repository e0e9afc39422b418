"""The per-tier load cost fit (kvtier.chain.cost.LoadCost) and the decision built on it.

Unit tests: a fake clock drives the time decay, samples are made up.
"""

from __future__ import annotations

import pytest

from kvtier.chain.cost import _CAP, QUANTILE, LoadCost, LoadDecision
from kvtier.config.load_policy import LoadConfig, Recompute

MS = 1e-3
KIB = 1024


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_latency_and_bandwidth_are_recovered_from_batches_of_several_sizes() -> None:
    cost = LoadCost(half_life=2.0, clock=Clock())
    for blocks in (1, 2, 4, 8, 3, 6):
        nbytes = blocks * 64 * KIB
        cost.observe(blocks, nbytes, 1 * MS + nbytes / 100e6)  # 1 ms + 100 MB/s
    fit = cost.fit()
    assert fit is not None
    latency, per_byte, spread, block_bytes = fit
    assert latency == pytest.approx(1 * MS, rel=1e-6)
    assert per_byte == pytest.approx(1 / 100e6, rel=1e-6)
    assert spread == pytest.approx(0.0, abs=1e-6)
    assert block_bytes == 64 * KIB
    assert cost.predict(10) == pytest.approx(1 * MS + 10 * 64 * KIB / 100e6, rel=1e-6)
    summary = cost.summary()
    assert summary["measured"] and summary["bandwidth_Bps"] == pytest.approx(100e6, rel=1e-6)
    assert summary["block_s"] == pytest.approx(1 * MS + 64 * KIB / 100e6, rel=1e-6)


def test_an_unmeasured_tier_costs_nothing() -> None:
    cost = LoadCost(clock=Clock())
    assert cost.fit() is None and cost.predict(100) == 0.0
    assert cost.summary() == {"measured": False, "block_s": 0.0}


def _mean_seconds(cost: LoadCost, nbytes: int) -> float:
    fit = cost.fit()
    assert fit is not None
    return fit[0] + fit[1] * nbytes


def test_old_samples_weigh_less_by_time_not_by_count() -> None:
    clock = Clock()
    now, later = LoadCost(half_life=1.0, clock=clock), LoadCost(half_life=1.0, clock=clock)
    for _ in range(8):
        now.observe(1, 4096, 1 * MS)
        later.observe(1, 4096, 1 * MS)
    now.observe(1, 4096, 100 * MS)  # at once: 8 fast samples, 1 slow
    clock.now += 3.0  # three half-lives: the 8 fast samples weigh 1
    later.observe(1, 4096, 100 * MS)
    assert _mean_seconds(now, 4096) == pytest.approx((8 * 1 + 100) / 9 * MS)
    assert _mean_seconds(later, 4096) == pytest.approx((1 + 100) / 2 * MS)


def test_a_new_sample_moves_the_fit_however_many_came_before() -> None:
    cost = LoadCost(half_life=60.0, clock=Clock())
    for _ in range(1000):
        cost.observe(1, 4096, 1 * MS)
    cost.observe(1, 4096, 100 * MS)
    # the 1000 fast samples weigh _CAP together
    assert _mean_seconds(cost, 4096) == pytest.approx((_CAP * 1 + 100) / (_CAP + 1) * MS)


def test_a_tier_not_read_for_a_while_is_unmeasured_again() -> None:
    clock = Clock()
    cost = LoadCost(half_life=1.0, clock=clock)
    for _ in range(20):
        cost.observe(1, 4096, 100 * MS)
    clock.now += 5.9  # _CAP * 2**-5.9 > 1/8 of a sample: still measured
    assert cost.predict(1) > 0
    clock.now += 0.2  # below 1/8 of a sample: forgotten, and trusted
    assert cost.fit() is None and cost.predict(1) == 0.0


def test_an_erratic_tier_is_judged_by_a_high_quantile_not_its_mean() -> None:
    clock = Clock()
    steady, erratic = LoadCost(clock=clock), LoadCost(clock=clock)
    for i in range(8):
        steady.observe(1, 4096, 10 * MS)
        erratic.observe(1, 4096, (1 if i % 2 else 19) * MS)  # the same 10 ms mean
    assert _mean_seconds(steady, 4096) == pytest.approx(_mean_seconds(erratic, 4096))
    assert steady.predict(1) == pytest.approx(10 * MS)
    assert QUANTILE == 0.9  # 10 ms + 1.28 standard deviations of 9 ms
    assert erratic.predict(1) == pytest.approx(10 * MS + 1.2816 * 9 * MS, rel=1e-3)


def _decision(clock: Clock, **config: object) -> LoadDecision:
    load = LoadConfig(**{"recompute": Recompute(((1, 1 * MS),)), **config})  # type: ignore[arg-type]
    return LoadDecision(load, 2, tokens_per_block=16, clock=clock)


def test_a_fast_start_is_loaded_and_a_slow_rest_declined() -> None:
    clock = Clock()
    decision = _decision(clock)
    for _ in range(4):
        decision.observe(0, [True], [4096], 0.1 * MS)  # RAM: 0.1 ms a block
        decision.observe(1, [True, False], [4096, 4096], 100 * MS)  # 100 ms a block
    # recomputing a block of 16 tokens takes 16 ms, 12.8 with the margin
    assert decision.worth([0, 0, 0, 1, 1, 1, None, 1]) == 3
    stats = decision.tier_stats(1)
    assert (stats["declined"], stats["declined_tokens"]) == (3, 48)
    assert decision.tier_stats(0)["declined"] == 0
    assert decision.worth([0, 0, 0, 1, 1, 1], tokens_per_block=128) == 6  # 102 ms per block


def test_a_latency_that_longer_prefixes_amortise_is_loaded() -> None:
    clock = Clock()
    decision = _decision(clock)
    for blocks in (1, 2, 4, 8):
        decision.observe(1, [True] * blocks, [4096] * blocks, 50 * MS + blocks * 1 * MS)
    # k blocks cost 50 + k ms against 12.8 k ms: worth it from 5 blocks on
    assert decision.worth([1] * 4) == 0
    assert decision.worth([1] * 5) == 5


@pytest.mark.parametrize("config", [{"policy": "always"}, {"recompute": None}])
def test_without_weighing_every_held_block_is_loaded(config: dict[str, object]) -> None:
    clock = Clock()
    decision = _decision(clock, **config)
    decision.observe(1, [True], [4096], 10.0)
    assert decision.worth([1, 1, None, 1]) == 2
    assert decision.tier_stats(1)["declined"] == 0


def test_an_unmeasured_tier_is_trusted_and_a_stale_one_tried_again() -> None:
    clock = Clock()
    decision = _decision(clock, half_life=1.0)
    assert decision.worth([1, 1, 1]) == 3
    decision.observe(1, [True], [4096], 1.0)
    assert decision.worth([1, 1, 1]) == 0
    clock.now += 2.9
    assert decision.worth([1, 1, 1]) == 0
    clock.now += 0.2  # one sample, three half-lives: below 1/8 of a sample
    assert decision.worth([1, 1, 1]) == 3


def test_a_slow_rest_is_declined_even_where_the_fast_start_would_pay_for_it() -> None:
    clock = Clock()
    decision = _decision(clock)
    decision.observe(0, [True], [4096], 0.1 * MS)
    decision.observe(1, [True], [4096], 20 * MS)  # above the 12.8 ms a block saves
    # loading all six (60.3 ms) is still below recomputing them (76.8 ms with the
    # margin), but recomputing the last three is faster than loading them
    assert decision.worth([0, 0, 0, 1, 1, 1]) == 3
