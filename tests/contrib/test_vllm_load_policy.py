"""vLLM's KvtierTier answers lookups with the chunks worth loading (the chain's load_policy).

The chain's tier is the sample plugin's ``sample-slow`` backend (found through
its entry point; its gets sleep per MiB).  A tier that has loaded from it
once answers MISS for what it holds: vLLM recomputes instead; with
``load_policy: always`` it answers HIT.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sample_plugin import sample_plugin
from vllm_chain import SpecStub, write_yaml

from kvtier.plugins import registry

__all__ = ["sample_plugin"]

DELAY = 10.0  # seconds per MiB: about 40 ms a 4 KiB chunk
ROW = 4096
VERDICT_TTL = 0.5  # seconds the tier reuses an answer: what the load taught it expires


def finish(tier: Any, job_id: int) -> Any:
    """Poll like vLLM's scheduler until the job reported."""
    while True:
        for res in tier.get_finished_jobs():
            if res.job_id == job_id:
                return res
        time.sleep(0.005)


def resolve(tier: Any, keys: list[bytes]) -> list[Any]:
    """Look keys up like vLLM: RETRY until the batched chain lookup answers."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext

    while True:
        answers = [tier.lookup(k, ReqContext(req_id="r")) for k in keys]
        if LookupResult.RETRY not in answers:
            return answers
        tier.on_schedule_end(ScheduleEndContext((), ()))
        time.sleep(0.005)


def job(job_id: int, keys: list[bytes], chunks: list[int], promotion: bool) -> Any:
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob

    return TransferJob(job_id, keys, np.array(chunks, dtype=np.int32), promotion,
                       ReqContext(req_id="r"))


@pytest.fixture
def slow_tier(tmp_path: Path, sample_plugin: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    pytest.importorskip("vllm")
    from kvtier.contrib.vllm.tier import KvtierTier

    monkeypatch.setattr(registry, "_DEFAULT", None)  # installed now: a registry that sees it
    made: list[Any] = []

    def make(policy: str) -> tuple[Any, np.ndarray]:
        config = write_yaml(
            tmp_path / "tiers.yaml",
            # vLLM's own CPU tier is the RAM above: the chain has no host tier
            [{"name": "slow", "backend": "sample-slow", "delay_per_mib": DELAY}],
            load_policy=policy, recompute="0.01ms/token",
        )
        region = np.zeros((8, ROW), dtype=np.uint8)
        spec = SpecStub(ROW, ("layers.0.attn", "layers.1.attn"))
        tier = KvtierTier(spec, memoryview(region), "KvtierTier", config=str(config),
                          verdict_ttl=VERDICT_TTL)
        made.append(tier)
        return tier, region

    yield make
    for tier in made:
        tier.shutdown()


@pytest.mark.parametrize(("policy", "answer"), [("cost", "MISS"), ("always", "HIT")])
def test_chunks_only_a_slow_tier_holds_are_misses_once_it_is_measured(
    slow_tier: Any, policy: str, answer: str
) -> None:
    from vllm.v1.kv_offload.base import LookupResult

    tier, region = slow_tier(policy)
    keys = [bytes([i]) * 36 for i in range(4)]
    for c in range(4):
        region[c] = c + 1
    tier.submit_store(job(1, keys, [0, 1, 2, 3], False))
    assert finish(tier, 1).success
    assert tier.chain.flush(30)
    tier.submit_load(job(2, keys, [4, 5, 6, 7], True))  # trusted while unmeasured
    assert finish(tier, 2).success
    assert [int(region[c][0]) for c in range(4, 8)] == [1, 2, 3, 4]
    assert (region[4:8] == region[0:4]).all()
    time.sleep(VERDICT_TTL)  # the load's HIT verdicts expire: the chain is asked again
    # 32 tokens a chunk: 0.32 ms to recompute, about 40 ms to load
    assert resolve(tier, keys) == [getattr(LookupResult, answer)] * 4
    assert tier.chain_stats()["tiers"][0]["declined"] == (4 if answer == "MISS" else 0)
