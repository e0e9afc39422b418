"""kvtier's policies in vLLM's CPU tier, in the real engine on vLLM's CPU build.

Two engine processes (``vllm_policy_child.py``) on a tiny random Llama built
for the module generate the same prompts greedily, in the same order; their
vLLM CPU tier (10 chunks of 32 tokens, no tier below it) runs
``S3FifoCachePolicy`` and ``AdaptiveCachePolicy`` from
``kvtier.contrib.vllm.cache_policy``, loaded by vLLM from ``eviction_policy``
+ ``cache_policy_module_path``.  Two prompts come back between one-off
prompts; each prompt is 4 chunks, so the tier must evict.  A prompt's first
generation is computed whole (no tier holds it yet); each later one served
from the tier must equal it token for token, prompts must be served from the
tier, and the policy objects vLLM built must have recorded the evictions and
hits.

The reference is the same engine's own computed generation, not a second
process without offloading: once in CI, a process's first prompt, computed
with nothing cached, ended on another token than the other processes'
(a near-tie of this random model's logits at its 8th token, settled
differently from one process to another), which says nothing of the tier.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from shared_pool import build_tiny_model, engine_env

pytest.importorskip("vllm")

SUPPORT = Path(__file__).parents[1] / "support"
CHUNK_BYTES = 2 * 2 * 2 * 32 * 32 * 4  # layers x (K, V) x kv heads x head_dim x tokens x fp32
CHUNKS = 10


def prompt(seed: int) -> list[int]:
    """132 tokens: 4 full chunks of 32 a tier can serve, and 4 more."""
    return [(i * (31 + 2 * seed) + 7 * seed) % 500 + 3 for i in range(132)]


PROMPTS = {f"hot{i}": prompt(i) for i in range(2)} | {f"once{i}": prompt(10 + i) for i in range(6)}
ORDER = ("hot0,hot1,once0,hot0,once1,once2,hot1,hot0,once3,hot0,once4,hot1,once5,hot0,hot1")


def extra(policy: str) -> dict[str, Any]:
    return {
        "spec_name": "KvtierOffloadingSpec",
        "spec_module_path": "kvtier.contrib.vllm.spec",
        "cpu_bytes_to_use": CHUNKS * CHUNK_BYTES,
        "eviction_policy": policy,
        "cache_policy_module_path": "kvtier.contrib.vllm.cache_policy",
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    base = tmp_path_factory.mktemp("policy-engine")
    model = build_tiny_model(base / "tiny-llama")
    procs = {}
    for name in ("S3FifoCachePolicy", "AdaptiveCachePolicy"):
        cmd = [sys.executable, str(SUPPORT / "vllm_policy_child.py"), "--model", model,
               "--prompts", json.dumps(PROMPTS), "--order", ORDER,
               "--out", str(base / f"{name}.json"), "--extra", json.dumps(extra(name))]
        log = open(base / f"{name}.log", "w")  # noqa: SIM115 (closed below)
        procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=base,
                                        env=engine_env(False)), log)
    out = {}
    for name, (proc, log) in procs.items():
        rc = proc.wait(timeout=900)
        log.close()
        assert rc == 0, (base / f"{name}.log").read_text()[-4000:]
        out[name] = json.loads((base / f"{name}.json").read_text())
    return out


@pytest.mark.parametrize("policy", ["S3FifoCachePolicy", "AdaptiveCachePolicy"])
def test_greedy_outputs_served_from_the_tier_equal_the_computed_ones(
    results: dict[str, dict[str, Any]], policy: str
) -> None:
    runs = results[policy]["runs"]
    assert [r["prompt"] for r in runs] == ORDER.split(",")
    computed: dict[str, list[int]] = {}
    for run in runs:
        if run["prompt"] not in computed:  # its first: no tier held any of it
            assert run["cached"] == 0
            computed[run["prompt"]] = run["ids"]
        assert run["ids"] == computed[run["prompt"]], run
    served = [r for r in runs if r["cached"]]
    assert served and all(r["prompt"].startswith("hot") for r in served)
    assert all(r["cached"] % 32 == 0 and r["cached"] <= 128 for r in served)
    assert len({tuple(ids) for ids in computed.values()}) == len(PROMPTS)  # told apart


@pytest.mark.parametrize("policy", ["S3FifoCachePolicy", "AdaptiveCachePolicy"])
def test_vllm_ran_kvtiers_policy_and_it_evicted(
    results: dict[str, dict[str, Any]], policy: str
) -> None:
    (stats,) = results[policy]["policies"]
    assert stats["cls"] == policy and stats["capacity_chunks"] == CHUNKS
    assert stats["chunks"] <= CHUNKS
    # 8 distinct prompts of 4 chunks went through a tier of 10: it evicted
    assert stats["inserts"] >= 8 * 4 - CHUNKS and stats["evictions"] > 0
    assert stats["inserts"] - stats["evictions"] == stats["chunks"]
    # chunks vLLM loaded from the tier: the policy counts each when its request
    # finishes, unless a later store evicted it by then
    loaded = sum(r["cached"] for r in results[policy]["runs"]) // 32
    assert loaded > 0 and stats["hits"] > 0
