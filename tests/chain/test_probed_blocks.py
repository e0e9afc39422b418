"""A block read to measure a tier is not read again by the load that follows
(kvtier.chain.probed), on the sample plugin's ``sample-slow`` backend through a chain."""

from __future__ import annotations

from typing import Any

from sample_plugin import sample_plugin

import kvtier
from kvtier.plugins.registry import BackendRegistry

__all__ = ["sample_plugin"]

NS = kvtier.Namespace("probed-blocks", dtype="bfloat16", tokens_per_block=16)
BLOCK = 64 * 1024
KEYS = [b"probed-%d" % i for i in range(8)]
BLOCKS = [bytes([i + 1]) * BLOCK for i in range(8)]
#: one tier, fast (no delay): a probe finds it faster than recomputing, and the prefix is loaded
CONFIG = {"chain": [{"name": "disk", "backend": "sample-slow", "delay_per_mib": 0.0}]}


def _chain_that_weighs() -> Any:
    chain = kvtier.open_chain(CONFIG, NS, registry=BackendRegistry())
    chain.recompute.observe(1024, 1.0)  # 1 ms a token: loads are weighed
    assert chain.put(KEYS, BLOCKS) == [True] * 8
    return chain


def _tier_reads(chain: Any) -> int:
    return int(chain.stats()["tiers"][0]["hits"])


def test_the_load_after_a_probe_reads_the_probed_block_once(sample_plugin: str) -> None:
    with _chain_that_weighs() as chain:
        assert chain.prefix_hits(KEYS) == 8
        assert chain.stats()["tiers"][0]["probes"] == 1 and _tier_reads(chain) == 1
        outs = [bytearray(BLOCK) for _ in KEYS]
        assert chain.get(KEYS, outs) == [True] * 8
        assert [bytes(o) for o in outs] == BLOCKS
        assert _tier_reads(chain) == 8  # the probe's block came from the probe
        # taken once: a second load reads every block from the tier
        again = [bytearray(BLOCK) for _ in KEYS]
        assert chain.get(KEYS, again) == [True] * 8 and [bytes(o) for o in again] == BLOCKS
        assert _tier_reads(chain) == 16


def test_an_evicted_or_other_sized_probed_block_is_not_served(sample_plugin: str) -> None:
    with _chain_that_weighs() as chain:
        assert chain.prefix_hits(KEYS) == 8  # block 0 probed
        assert chain.evict(KEYS[:1]) == 1
        other = b"\xee" * BLOCK
        assert chain.put(KEYS[:1], [other]) == [True]
        out = bytearray(BLOCK)
        assert chain.get(KEYS[:1], [out]) == [True] and bytes(out) == other
    with _chain_that_weighs() as chain:
        assert chain.prefix_hits(KEYS) == 8
        small = bytearray(BLOCK // 2)  # not the block's size: a miss, as from the tier
        assert chain.get(KEYS[:1], [small]) == [False]
        assert chain.stats()["tiers"][0]["size_mismatch"] == 1
