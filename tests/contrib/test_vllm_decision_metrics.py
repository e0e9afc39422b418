"""The load decision on vLLM's own metrics: a slow tier's declined blocks, and why.

One engine process (``vllm_runner.py``, vLLM on the CPU, stats logging on)
over a chain whose only tier is the sample plugin's ``sample-slow`` backend
(found through its entry point; its gets sleep per MiB), with no
``recompute`` in the YAML.  Phase 0 computes a prompt: kvtier times the
recompute and learns the rate, and the prompt's blocks go to the slow tier.
Phase 1, vLLM's caches reset, asks for the prompt again: the tier holds its
blocks, is measured, and declined; vLLM computes the prompt.

What vLLM reported (``LLM.get_metrics()``, the figures of its ``/metrics``)
must be the chain's own figures: per tier the blocks and tokens declined, the
probes, read-backs and kept fits; the recompute model's source and samples;
and the tier's expected load time a block beside the recompute time it was
weighed against.  A unit test holds the counters to deltas between reports
and the source gauge to one series at 1.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from runner_process import RunnerProcess
from sample_plugin import sample_plugin
from shared_pool import engine_env
from vllm_chain import write_yaml

__all__ = ["sample_plugin"]

log = logging.getLogger("kvtier.tests")
SUPPORT = Path(__file__).parents[1] / "support"
# 4 full blocks of 32 tokens and 4 more
PROMPTS = {"p1": [(i * 37 + 11) % 500 + 3 for i in range(132)]}
CHUNK = 32
# a block of the tiny model is 32 KiB (2 layers, K and V, 2 heads of 32, fp32): 0.2 s a read,
# some ten times what recomputing its 32 tokens takes
DELAY = 6.4


def metric(phase: dict[str, Any], name: str) -> float:
    return float(phase["metrics"].get(name, 0))


@pytest.mark.timeout(900)
def test_a_declined_slow_tier_and_the_model_it_lost_to_are_on_vllms_metrics(
    model_dir: str, sample_plugin: str, tmp_path: Path
) -> None:
    config = write_yaml(tmp_path / "tiers.yaml",
                        [{"name": "slow", "backend": "sample-slow", "delay_per_mib": DELAY}],
                        load_policy="cost")
    env = engine_env()
    env["PYTHONPATH"] = ":".join(p for p in (sample_plugin, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, str(SUPPORT / "vllm_runner.py"), "--model", model_dir,
           "--prompts", json.dumps(PROMPTS), "--kvtier-config", str(config),
           "--phases", "p1;p1", "--reset-between", "--settle", "2"]
    run = RunnerProcess(cmd, tmp_path, tmp_path / f"run-{uuid.uuid4().hex[:8]}.log", env)
    try:
        result = run.result()
    finally:
        run.kill()

    first, second = result["phases"]
    log.info("vLLM's kvtier figures after the decline: %s; the chain's: %s",
             second["metrics"], second["local"])
    assert second["runs"][0]["ids"] == first["runs"][0]["ids"]
    assert second["runs"][0]["num_cached_tokens"] == 0  # vLLM computed the prompt again
    (local,) = second["local"]
    slow, model = local["chain"]["slow"], local["recompute"]
    assert model["source"] == "learned" and model["samples"] >= 1  # from phase 0's compute
    assert slow["declined"] >= 4 and slow["declined_tokens"] == slow["declined"] * CHUNK
    # vLLM's figures are the chain's
    assert metric(second, "declined_blocks{slow}") == slow["declined"]
    assert metric(second, "declined_tokens{slow}") == slow["declined_tokens"]
    assert metric(second, "probed_blocks{slow}") == slow["probes"]
    assert metric(second, "kept_costs{slow}") == slow["kept_costs"] == 0
    # measured by reading back what phase 0 stored
    assert metric(second, "read_back_blocks{slow}") == slow["read_backs"] >= 1
    assert metric(second, "read_back_failures{slow}") == slow["read_back_failures"] == 0
    assert metric(second, "recompute_source{learned}") == 1.0
    assert metric(second, "recompute_source{configured}") == 0.0
    assert metric(second, "recompute_source{none}") == 0.0
    assert metric(second, "recompute_samples{}") == model["samples"]
    per_token = metric(second, "recompute_seconds_per_token{}")
    assert per_token == pytest.approx(model["per_token_s"])
    # why: a block took longer to load than its tokens to recompute
    assert metric(second, "block_load_seconds{slow}") > per_token * CHUNK > 0
    assert metric(second, "load_samples{slow}") >= 1
    # before the decision, nothing was declined and no model was in effect
    assert metric(first, "declined_blocks{slow}") == 0


def test_decision_counters_are_reported_as_deltas_and_one_source_is_set() -> None:
    pytest.importorskip("vllm")
    from kvtier.contrib.vllm.tier_metrics import metric_definitions, offloading_stats

    def chain(declined: int, source: str, samples: int) -> dict[str, Any]:
        return {"tiers": [{"name": "slow", "healthy": True, "declined": declined,
                           "declined_tokens": declined * CHUNK, "probes": 1,
                           "load_cost": {"measured": True, "block_s": 0.2, "samples": 1}}],
                "recompute": {"source": source, "per_token_s": 1e-4 if samples else 0.0,
                              "samples": samples}}

    reported: dict[str, dict[str, int]] = {}
    stats = [offloading_stats({}, chain(3, "none", 0), reported),
             offloading_stats({}, chain(5, "learned", 2), reported)]
    definitions = metric_definitions()  # vLLM's logger rejects a metric it was not told about
    for one in stats:
        for metric_name, by_label in one.data["data"].items():
            assert all(len(labels) == len(definitions[metric_name].labelnames)
                       for labels in by_label), metric_name
    first, second = (one.reduce() for one in stats)
    name = "vllm:kv_offload_kvtier_"
    assert (first[f"{name}declined_blocks:('slow',)"], second[f"{name}declined_blocks:('slow',)"],
            second[f"{name}declined_tokens:('slow',)"]) == (3, 2, 2 * CHUNK)
    assert f"{name}probed_blocks:('slow',)" not in second  # no new probe
    assert [first[f"{name}recompute_source:('{s}',)"] for s in ("configured", "learned", "none")
            ] == [0.0, 0.0, 1.0]
    assert [second[f"{name}recompute_source:('{s}',)"] for s in ("configured", "learned", "none")
            ] == [0.0, 1.0, 0.0]  # the source moved: no stale 1 left on "none"
    assert (second[f"{name}recompute_samples"], second[f"{name}recompute_seconds_per_token"],
            second[f"{name}block_load_seconds:('slow',)"]) == (2, 1e-4, 0.2)
