"""LMCache's lookup-and-lock locks the chunks worth loading (the chain's load_policy).

A RAM tier holds the first chunks, the sample plugin's ``sample-slow`` backend
(found through its entry point; its gets sleep per MiB) all of them.  From the
first lookup on (it measures each tier by reading one block of it), a lookup
locks the RAM chunks and leaves the slow ones to be recomputed; with
``load_policy: always`` it locks them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

lmcache = pytest.importorskip(
    "lmcache.v1.distributed.l2_adapters",
    reason="lmcache is not installed (make venv installs lmcache==0.5.6)",
)

from lmcache_driver import fetch, fill, lock, objects, okey, store  # noqa: E402
from sample_plugin import sample_plugin  # noqa: E402

from kvtier.contrib.lmcache import kvtier_key  # noqa: E402
from kvtier.plugins import registry  # noqa: E402

__all__ = ["sample_plugin"]


@pytest.mark.parametrize(("policy", "locked"), [("cost", 3), ("always", 8)])
def test_lookup_locks_the_fast_chunks_and_leaves_the_slow_ones(
    tmp_path: Path, sample_plugin: str, monkeypatch: pytest.MonkeyPatch, adapter_of: Any,
    l1: Any, policy: str, locked: int
) -> None:
    monkeypatch.setattr(registry, "_DEFAULT", None)  # installed now: a registry that sees it
    chain_yaml = tmp_path / "tiers.yaml"
    chain_yaml.write_text(
        "chain:\n"
        "  - {name: ram, backend: host, capacity: 1MiB, promote: false}\n"
        # 100 ms a 16 KiB chunk, against 32 ms to recompute its 32 tokens
        "  - {name: slow, backend: sample-slow, delay_per_mib: 6.4}\n"
        f"load_policy: {policy}\nrecompute: 1ms/token\n"
    )
    adapter = adapter_of(str(chain_yaml),
                         namespace={"model": "tiny/llama", "tokens_per_block": 32})
    keys = [okey(i) for i in range(8)]
    objs = objects(l1, 8)
    data = fill(objs, seed=5)
    assert store(adapter, keys, objs).is_successful()
    assert adapter.chain.flush(30)
    adapter.chain.tiers[0].evict([kvtier_key(k) for k in keys[3:]])  # 3-7 only in the slow tier
    # a fresh chain: the lookup measures each tier by reading one block of it
    assert fetch(adapter, l1, keys) == data[:locked] + [None] * (8 - locked)
    assert lock(adapter, keys) == [True] * locked + [False] * (8 - locked)
    adapter.submit_unlock(keys[:locked])
    slow = adapter.chain.stats()["tiers"][1]
    declined = 2 * (8 - locked)  # by both lookups
    assert (slow["declined"], slow["declined_tokens"]) == (declined, declined * 32)
    assert slow["probes"] == (2 if policy == "cost" else 0)  # the second confirms it
