"""KV events from kvtier's vLLM tier: what the chain stores and removes, for routers.

Unit level, on real tiers (fs -> fs): stores, capacity evictions in a lower
tier, and a purge reported by an operator's tool.  The engine run with vLLM's KV events
on is in ``test_vllm_engine.py``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from vllm_chain import SpecStub

ROW = 4096


def make_tier(tmp_path: Path, chain: list[dict[str, Any]], events: bool = True) -> Any:
    from kvtier.contrib.vllm.tier import KvtierTier

    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump({"chain": [
        {"name": "ram", "backend": "host", "capacity": 1 << 20}, *chain]}))
    region = np.zeros((8, ROW), dtype=np.uint8)
    for c in range(8):
        region[c] = c + 1
    return KvtierTier(SpecStub(ROW, events=events), memoryview(region), "KvtierTier",
                      config=str(path))


def store(tier: Any, job_id: int, key: bytes) -> None:
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob

    tier.submit_store(TransferJob(job_id, [key], np.array([job_id % 8], dtype=np.int32),
                                  False, ReqContext(req_id="r")))
    deadline = time.monotonic() + 10
    while not any(r.job_id == job_id for r in tier.get_finished_jobs()):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    tier.chain.flush(10)


def collect(tier: Any) -> tuple[list[bytes], list[bytes]]:
    from vllm.v1.kv_offload.base import Medium

    stored: list[bytes] = []
    removed: list[bytes] = []
    for event in tier.take_events():
        assert event.medium is Medium.STORAGE
        (removed if event.removed else stored).extend(event.keys)
    return stored, removed


def test_tier_reports_stores_and_blocks_no_kvtier_tier_holds(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    # disk holds 3 blocks, far (written through) 2: far evicts first, while disk
    # still has the block (no event), then disk evicts it too (removed)
    block = ROW + 1024  # payload and header, as the fs backend counts them
    tier = make_tier(tmp_path, [
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "disk"), "capacity": 3 * block},
        {"name": "far", "backend": "fs", "url": str(tmp_path / "far"), "capacity": 2 * block,
         "write": "through"},
    ])
    try:
        keys = [bytes([i]) * 36 for i in range(1, 7)]
        for job_id, key in enumerate(keys, 1):
            store(tier, job_id, key)
        stored, removed = collect(tier)
        assert stored == keys  # once each, not again when copied down to far
        gone = [k for k, where in zip(keys, tier.chain.lookup(keys)) if where is None]
        assert gone and sorted(removed) == sorted(gone)
        # lower-tier evictions of blocks disk still holds were not reported
        held = [k for k in keys if k not in gone]
        assert tier.chain.tiers[1].lookup(held) != [True] * len(held)
        assert not set(held) & set(removed)
        assert collect(tier) == ([], [])  # each event taken once
        assert tier.adapter_stats()["kv_events:stored"] == 6
        assert tier.adapter_stats()["kv_events:removed"] == len(gone)
        # an operator's purge reaches vLLM through the same surface
        tier.chain.evict(held[:1])
        tier.chain.report_removed(0, held[:1], "purge")
        assert collect(tier)[1] == [held[0], held[0]]
    finally:
        tier.shutdown()


def test_no_events_unless_vllm_asks(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    tier = make_tier(tmp_path, [{"name": "disk", "backend": "fs", "url": str(tmp_path / "d")}],
                     events=False)
    try:
        store(tier, 1, b"k" * 36)
        assert list(tier.take_events()) == []
    finally:
        tier.shutdown()
