"""A tier's counters and its latency histogram."""

from __future__ import annotations

import pytest

from kvtier.observe.stats import LatencyHistogram, TierStats


def test_histogram_quantiles_bound_the_samples() -> None:
    hist = LatencyHistogram()
    for micros in [1] * 90 + [1000] * 9 + [100_000]:
        hist.add(micros / 1e6)
    assert hist.count == 100
    assert 1e-6 <= hist.quantile(0.5) <= 2e-6
    assert 1e-3 <= hist.quantile(0.99) <= 2.1e-3
    assert hist.quantile(1.0) >= 0.1
    assert hist.summary()["mean_s"] == pytest.approx(hist.total / 100)
    assert LatencyHistogram().quantile(0.5) == 0.0


def test_tier_stats_snapshot_and_timing() -> None:
    stats = TierStats()
    stats.add(hits=2, misses=1)
    stats.add(hits=1)
    with stats.timed("get"):
        pass
    snap = stats.snapshot()
    assert (snap["hits"], snap["misses"]) == (3, 1)
    assert snap["latency"]["get"]["count"] == 1
    assert "lock" not in snap
