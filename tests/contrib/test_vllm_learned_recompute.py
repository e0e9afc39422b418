"""vLLM on the CPU behind a slow tier with no ``recompute`` in the YAML: learned, kept, used.

Fresh engine processes (``tests/support/vllm_slow_tier.py``) time one
2048-token prompt each, behind the sample plugin's ``sample-slow`` backend
(its folder declared persistent), slowed so that loading the prompt takes
about 3 times as long as recomputing it.  The first process computes the
prompt with offloading: kvtier times vLLM's recompute, from the miss its
lookup answered to the store of the computed blocks, and once the stores
stop it reads two of the blocks back (``kvtier.chain.readback``): it keeps
both the rate and the tier's load cost in the tier's catalog.  The second
process, the first after the one that computed the prompt, starts with
both: it declines the tier without a probe or any read, and vLLM computes
the prompt; its first token and top logprobs are those of a run without
offloading.

Before the learned model, a chain without ``recompute`` loaded every hit,
however slow (``always (no recompute model configured)``); before the
read-back, the second process probed the tier (two blocks read from it).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from sample_plugin import sample_plugin
from vllm_slow_checks import CHUNK, SLOWER, TOKENS, needs_vllm, prompt_engine, same_output
from vllm_slow_tier import chain_yaml

__all__ = ["sample_plugin"]

log = logging.getLogger("kvtier.tests")


def slow_tier(slow_dir: Path, delay: float) -> dict[str, Any]:
    return {"name": "slow", "backend": "sample-slow", "root": str(slow_dir),
            "delay_per_mib": delay, "persistent": True}


def kv_bytes(model: str) -> int:
    """The prompt's KV in float32, from the model's config: what the tier is slowed for."""
    config = json.loads((Path(model) / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return TOKENS * config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 4


@needs_vllm
@pytest.mark.timeout(1800)  # three engine processes on two shared cores
def test_the_first_process_after_the_computing_one_declines_a_slow_tier_unread(
    tmp_path: Path, sample_plugin: str
) -> None:
    engine = prompt_engine(tmp_path, sample_plugin)
    slow_dir = tmp_path / "slow"
    plain = engine(None)
    estimate = kv_bytes(str(tmp_path / "model"))
    delay = SLOWER * plain["ttft_s"] / (estimate / 2**20)
    config = chain_yaml(tmp_path / "slow.yaml", slow_tier(slow_dir, delay), "cost", None)
    # no recompute entry: the first process has nothing to weigh, computes, and learns
    # both what recomputing costs and, reading back what it stored, what a load costs
    first = engine(config, store=True)
    same_output(first, plain)
    assert first["cached_tokens"] == 0
    learned = first["recompute"]
    assert (learned["source"], learned["kept_in"]) == ("learned", "slow")
    assert learned["samples"] == 1 and learned["model"].endswith("/token")
    # the engine's own rate: what the prompt took without offloading, a token (the
    # interval also holds the copy to vLLM's CPU tier and a step or two)
    rate = plain["ttft_s"] / TOKENS
    assert rate / 3 < learned["per_token_s"] < rate * 3
    slow = first["tiers"]["slow"]
    assert 0.5 < slow["bytes_in"] / estimate < 2  # slowed as meant
    assert slow["probes"] == 0  # nothing weighed, nothing probed: read back once idle

    blocks = TOKENS // CHUNK
    second = engine(config)
    same_output(second, plain)
    assert second["recompute"]["source"] == "learned"
    assert second["recompute"]["samples"] >= 1  # read from the tier: this process had it first
    assert second["cached_tokens"] == 0  # vLLM computed the whole prompt
    kept = second["tiers"]["slow"]
    assert (kept["probes"], kept["hits"], kept["kept_costs"]) == (0, 0, 1)  # declined unread
    assert kept["declined"] >= blocks - 1
    # what the first read back, kept: a block costs more than recomputing its tokens
    assert kept["load_source"] == "kept read-back"
    assert kept["block_s"] > 0.8 * learned["per_token_s"] * CHUNK  # load_margin 0.8
    log.info("TTFT: no offload %.3f s, computing process %.3f s, the next one %.3f s "
             "(%.2fx); learned %s, a block read back in %.3f s", plain["ttft_s"],
             first["ttft_s"], second["ttft_s"], second["ttft_s"] / plain["ttft_s"],
             learned["model"], kept["block_s"])
