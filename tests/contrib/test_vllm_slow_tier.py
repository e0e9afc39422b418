"""vLLM on the CPU with a tier made slow on purpose: the load decision recomputes.

Fresh engine processes time one 2048-token prompt each
(``tests/support/vllm_slow_tier.py``): with no offloading; storing the prompt
down a chain whose lower tier is the sample plugin's ``sample-slow`` backend
(found through its entry point, blocks kept in a folder); then reading it
back, in new processes, with that tier slowed so that loading the prompt
takes about 3 times as long as recomputing it, once with kvtier's decision
(``load_policy: cost``, the recompute rate measured by the first process) and
once with ``load_policy: always``.

What is asserted is what each process read and the output, never the time:
with the decision, two blocks are read from the slow tier (the probe that
measures it, and the read that confirms it is slow) and vLLM computes the
whole prompt; with ``always`` every block
comes from the slow tier.  The first token and its top logprobs agree in
every run.  The times are logged; ``bench/vllm_slow_tier.py`` measures them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml
from sample_plugin import sample_plugin
from vllm_slow_checks import CHUNK, SLOWER, TOKENS, needs_vllm, prompt_engine, same_output
from vllm_slow_tier import chain_yaml

__all__ = ["sample_plugin"]

log = logging.getLogger("kvtier.tests")


def chain(path: Path, slow_dir: Path, policy: str, delay: float,
          rate: float | None = None) -> Path:
    tier = {"name": "slow", "backend": "sample-slow", "root": str(slow_dir),
            "delay_per_mib": delay}
    return chain_yaml(path, tier, policy, rate)


def test_the_chain_behind_vllms_cpu_tier_keeps_the_load_policy_and_recording(
    tmp_path: Path
) -> None:
    from kvtier.contrib.vllm import secondary_chain_config

    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump({
        "chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"},
                  {"name": "disk", "backend": "fs", "url": str(tmp_path / "kv")}],
        "load_policy": "always", "recompute": "2ms/token", "load_margin": 0.5,
        "cost_half_life": "3s", "record": str(tmp_path / "trace.jsonl"),
    }))
    chain = secondary_chain_config(path)  # vLLM's CPU tier takes the host tier's place
    assert [t.name for t in chain.tiers] == ["disk"]
    assert (chain.load.policy, chain.load.margin, chain.load.half_life) == ("always", 0.5, 3.0)
    assert chain.load.recompute is not None and chain.load.recompute.points == ((1, 0.002),)
    assert chain.record is not None and chain.record.path == str(tmp_path / "trace.jsonl")


@needs_vllm
def test_a_slow_tier_is_declined_in_a_fresh_process_and_always_loads_it(
    tmp_path: Path, sample_plugin: str
) -> None:
    engine = prompt_engine(tmp_path, sample_plugin)
    slow_dir = tmp_path / "slow"
    plain = engine(None)
    assert plain["cached_tokens"] == 0
    stored = engine(chain(tmp_path / "store.yaml", slow_dir, "always", 0.0), store=True)
    same_output(stored, plain)
    blocks = TOKENS // CHUNK
    kv_bytes = stored["tiers"]["slow"]["bytes_in"]
    assert len(list(slow_dir.rglob("*"))) >= blocks and kv_bytes > 0
    rate = plain["ttft_s"] / TOKENS  # the engine's recompute time a token, measured here
    delay = SLOWER * plain["ttft_s"] / (kv_bytes / 2**20)

    decided = engine(chain(tmp_path / "cost.yaml", slow_dir, "cost", delay, rate))
    same_output(decided, plain)
    slow = decided["tiers"]["slow"]
    assert decided["cached_tokens"] == 0  # vLLM computed the whole prompt
    # one block read to measure the tier, and a second to confirm it is slow
    assert (slow["probes"], slow["hits"]) == (2, 2)
    assert slow["bytes_out"] == 2 * kv_bytes // blocks
    assert slow["declined"] >= blocks - 1

    loaded = engine(chain(tmp_path / "always.yaml", slow_dir, "always", delay, rate))
    same_output(loaded, plain)
    slow = loaded["tiers"]["slow"]
    assert loaded["cached_tokens"] >= TOKENS - CHUNK
    assert (slow["probes"], slow["declined"]) == (0, 0)
    assert slow["hits"] >= blocks - 1 and slow["bytes_out"] >= kv_bytes * (blocks - 1) // blocks

    log.info("TTFT: no offload %.3f s, decision %.3f s (%.2fx), always %.3f s (%.2fx)",
             plain["ttft_s"], decided["ttft_s"], decided["ttft_s"] / plain["ttft_s"],
             loaded["ttft_s"], loaded["ttft_s"] / plain["ttft_s"])
