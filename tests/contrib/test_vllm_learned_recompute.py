"""vLLM on the CPU behind a slow tier with no ``recompute`` in the YAML: learned, kept, used.

Fresh engine processes (``tests/support/vllm_slow_tier.py``) time one
2048-token prompt each.  The first computes it with offloading to the sample
plugin's ``sample-slow`` backend (no delay yet, its folder declared
persistent): kvtier times vLLM's recompute, from the miss its lookup answered
to the store of the computed blocks, and keeps the rate in the tier's
catalog.  The second process, with the tier slowed so that loading the
prompt takes about 3 times as long as recomputing it, starts with that rate:
it probes the tier (two blocks), declines it, and vLLM computes the prompt;
its first token and top logprobs are those of a run without offloading.  It
keeps what it measured of the tier, so a third process declines the tier
without reading it (no probe).

Before the learned model, a chain without ``recompute`` loaded every hit,
however slow (``always (no recompute model configured)``).
"""

from __future__ import annotations

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


@needs_vllm
@pytest.mark.timeout(2400)  # four engine processes on two shared cores
def test_a_fresh_process_declines_a_slow_tier_by_what_the_first_one_learned(
    tmp_path: Path, sample_plugin: str
) -> None:
    engine = prompt_engine(tmp_path, sample_plugin)
    slow_dir = tmp_path / "slow"
    plain = engine(None)
    # no recompute entry: the first process loads blindly, computes, and learns
    first = engine(chain_yaml(tmp_path / "first.yaml", slow_tier(slow_dir, 0.0), "cost", None),
                   store=True)
    same_output(first, plain)
    assert first["cached_tokens"] == 0
    learned = first["recompute"]
    assert (learned["source"], learned["kept_in"]) == ("learned", "slow")
    assert learned["samples"] == 1 and learned["model"].endswith("/token")
    # the engine's own rate: what the prompt took without offloading, a token (the
    # interval also holds the copy to vLLM's CPU tier and a step or two)
    rate = plain["ttft_s"] / TOKENS
    assert rate / 3 < learned["per_token_s"] < rate * 3

    blocks = TOKENS // CHUNK
    kv_bytes = first["tiers"]["slow"]["bytes_in"]
    assert kv_bytes > 0
    delay = SLOWER * plain["ttft_s"] / (kv_bytes / 2**20)
    second = engine(chain_yaml(tmp_path / "second.yaml", slow_tier(slow_dir, delay), "cost",
                               None))
    same_output(second, plain)
    assert second["recompute"]["source"] == "learned"
    assert second["recompute"]["samples"] >= 1  # read from the tier: this process had it first
    assert second["cached_tokens"] == 0  # vLLM computed the whole prompt
    slow = second["tiers"]["slow"]
    assert (slow["probes"], slow["hits"]) == (2, 2)  # measured, found slow, declined
    assert slow["declined"] >= blocks - 1
    assert slow["kept_costs"] == 0  # nothing kept of the slowed tier yet
    # the second kept what its probes measured: the third declines the tier unread
    third = engine(chain_yaml(tmp_path / "second.yaml", slow_tier(slow_dir, delay), "cost",
                              None))
    same_output(third, plain)
    assert third["cached_tokens"] == 0
    kept = third["tiers"]["slow"]
    assert (kept["probes"], kept["hits"], kept["kept_costs"]) == (0, 0, 1)
    assert kept["declined"] >= blocks - 1
    log.info("TTFT: no offload %.3f s, learned decision %.3f s (%.2fx), with the kept load "
             "cost %.3f s (%.2fx); learned %s", plain["ttft_s"], second["ttft_s"],
             second["ttft_s"] / plain["ttft_s"], third["ttft_s"],
             third["ttft_s"] / plain["ttft_s"], learned["model"])
