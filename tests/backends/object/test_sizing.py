"""The object tier's online sizing against real object tiers of other capacities (SeaweedFS).

The tier deletes the oldest objects first, whatever was read: its miniatures
are FIFO, and must make the same decisions as a real tier of their size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from seaweed import SeaweedServer
from sizing_replay import assert_estimates, document_batches, replay, zipf_batches

from kvtier.plugins.registry import BackendHandle, BackendRegistry
from kvtier.spec.base import BlockStore

SIZE = 64
#: No LIST pass while a test runs: the index is the instance's own puts, in their order.
QUIET = {"scan_interval": "100000h", "lookup_cache_ttl": 0}


def opener(server: SeaweedServer, bucket: str) -> Callable[..., BackendHandle]:
    def open_(namespace: int, **over: Any) -> BackendHandle:
        handle = BackendRegistry().create("object")
        instance = handle.instance
        assert isinstance(instance, BlockStore)
        options = {name: o.default for name, o in instance.kvtier_options().items()}
        options.update(bucket=bucket, endpoint=server.endpoint, access_key_id=server.access_key,
                       secret_access_key=server.secret_key, region=server.region, **QUIET,
                       **over)
        handle.open(options, f"{namespace:032x}")
        return handle
    return open_


def test_a_full_sample_estimates_other_capacities_exactly(
    s3_server: SeaweedServer, bucket: str
) -> None:
    """At sizing_sample 1 each miniature is an object tier of that capacity: gets are no use."""
    open_ = opener(s3_server, bucket)
    blocks = 40
    tier = open_(1, capacity=blocks * SIZE, sizing_sample=1)
    others = {m: open_(n, capacity=int(blocks * m) * SIZE, sizing_sample=0)
              for n, m in enumerate((0.5, 1, 2), start=2)}
    try:
        real = replay(tier, others, document_batches(40), bytes(SIZE))
        stats = tier.stats()
        assert not any(name.startswith("sizing") for name in others[1].stats())
    finally:
        for handle in (tier, *others.values()):
            handle.close()
    assert stats["sizing_gets"] == real.gets and stats["sizing_sample"] == 1
    for m in others:
        assert stats[f"sizing_hit_ratio_{m:g}x"] == real.ratio(m), m
    assert 0 < real.hits[0.5] < real.hits[1] < real.hits[2]


def test_a_sample_of_keys_estimates_near_the_real_ratios(
    s3_server: SeaweedServer, bucket: str
) -> None:
    """Zipf(0.9), half of the keys sampled: within the sample's tolerance of real tiers
    (batches of 64: the requests of a batch run in parallel)."""
    open_ = opener(s3_server, bucket)
    blocks = 600
    tier = open_(1, capacity=blocks * SIZE, sizing_sample=0.5)
    others = {m: open_(n, capacity=int(blocks * m) * SIZE, sizing_sample=0)
              for n, m in enumerate((0.5, 2), start=2)}
    try:
        real = replay(tier, others, zipf_batches(2_000, 2_500, batch=64), bytes(SIZE))
        stats = tier.stats()
    finally:
        for handle in (tier, *others.values()):
            handle.close()
    assert stats["sizing_sample"] == 0.5 and 0 < stats["sizing_gets"] < real.gets
    assert_estimates(stats, real)
    assert real.hits[0.5] < real.hits[2]


def test_without_capacity_nothing_is_estimated(s3_server: SeaweedServer, bucket: str) -> None:
    tier = opener(s3_server, bucket)(1)
    try:
        tier.put([b"k"], [bytes(SIZE)], [])
        assert not any(name.startswith("sizing") for name in tier.stats())
    finally:
        tier.close()
