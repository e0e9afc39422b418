"""SGLang's batch_exists answers with the pages worth loading (the chain's load_policy).

A RAM tier holds the first pages, the sample plugin's ``sample-slow`` backend
(found through its entry point; its gets sleep per MiB) all of them.  From the
first lookup on (it measures each tier by reading one block of it),
``batch_exists`` offers the RAM pages and leaves the slow ones to be
recomputed; with ``load_policy: always`` it offers them all.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

if importlib.util.find_spec("sglang") is None:
    pytest.skip("SGLang is not installed", allow_module_level=True)

from sample_plugin import sample_plugin
from sglang_host import import_host_pools, mha_pool

import_host_pools()  # before SGLang's other modules: see tests/support/sglang_host.py
from sglang_pages import attach, fill_random, load_v1, page_bytes, page_hashes, save_v1  # noqa: E402

from kvtier.plugins import registry  # noqa: E402

__all__ = ["sample_plugin"]


@pytest.mark.parametrize(("policy", "pages"), [("cost", 3), ("always", 6)])
def test_batch_exists_offers_the_fast_pages_and_leaves_the_slow_ones(
    tmp_path: Path, sample_plugin: str, monkeypatch: pytest.MonkeyPatch, policy: str, pages: int
) -> None:
    monkeypatch.setattr(registry, "_DEFAULT", None)  # installed now: a registry that sees it
    chain_yaml = tmp_path / "tiers.yaml"
    chain_yaml.write_text(yaml.safe_dump({
        "chain": [
            {"name": "ram", "backend": "host", "capacity": "64MiB", "promote": False},
            # about 50 ms a block, against 2 ms to recompute its 2 tokens
            {"name": "slow", "backend": "sample-slow", "delay_per_mib": 100.0},
        ],
        "load_policy": policy,
        "recompute": "1ms/token",
    }))
    pool = mha_pool("page_first")
    fill_random(pool, seed=7)
    keys = page_hashes(6, seed=7)
    backend = attach(chain_yaml, pool)
    chain = backend.chain
    assert chain is not None
    assert save_v1(backend, pool, keys, first_page=0)
    assert chain.flush(30)
    chain.tiers[0].evict(backend._page_keys(keys[3:]))  # pages 3-5 only in the slow tier
    # a fresh chain: the lookup measures each tier by reading one block of it
    assert backend.batch_exists(keys) == pages
    assert load_v1(backend, pool, keys, first_page=10) == 6  # every page, byte for byte
    assert page_bytes(pool, 10, 6) == page_bytes(pool, 0, 6)
    assert backend.batch_exists(keys) == pages
    slow = next(t for t in backend.chain_stats()["tiers"] if t["name"] == "slow")
    assert slow["declined"] == 2 * (6 - pages) * backend._regions  # by both answers
    assert slow["probes"] == (2 if policy == "cost" else 0)  # the second confirms it
    backend.close()
