"""vLLM's ``kv_hints`` on kvtier's vLLM tier: a request whose hints hold the action
``kvtier.keep`` (version 1) has its stored blocks kept in its tenant's chain.

Driven as vLLM's scheduler drives the tier, with vLLM 0.32's own ``ReqContext``,
``KvHintsEnvelope``, ``KvHintAction`` and ``TransferJob``, and a real ``fs`` tier on
its shared pool (vLLM's CPU tier stands where a host tier would).  The real engine
run (``AsyncLLM.generate(..., kv_hints=...)``) is tests/contrib/test_vllm_keep_engine.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_chain import SpecStub, write_yaml

ROW = 4096
KEYS = [bytes([i]) * 36 for i in range(3)]


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[tuple[Any, np.ndarray]]:
    pytest.importorskip("vllm")
    from kvtier.contrib.vllm.tier import KvtierTier

    config = write_yaml(tmp_path / "tiers.yaml", [{
        "name": "disk", "backend": "fs", "url": str(tmp_path / "store"), "capacity": "4MiB",
        "tenants": {"*": {"keep": "1MiB"}}}])
    region = np.zeros((8, ROW), dtype=np.uint8)
    made = KvtierTier(SpecStub(ROW, ("layers.0.attn", "layers.1.attn")),
                      memoryview(region), "KvtierTier", config=str(config))
    yield made, region
    made.shutdown()


def request(req_id: str, *actions: tuple[str, str]) -> Any:
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope
    from vllm.v1.kv_offload.base import ReqContext

    hints = KvHintsEnvelope(protocol_version="1", message_id=req_id, actions=[
        KvHintAction(action_id=f"{req_id}-{i}", action_type=kind, action_version=version,
                     payload={}) for i, (kind, version) in enumerate(actions)])
    return ReqContext(req_id=req_id, kv_hints=hints if actions else None)


def store(tier: Any, region: np.ndarray, req: Any, job_id: int) -> None:
    from vllm.v1.kv_offload.tiering.base import TransferJob

    for c in range(3):
        region[c] = job_id + c
    tier.submit_store(TransferJob(job_id, KEYS, np.array([0, 1, 2], dtype=np.int32), False, req))
    deadline = time.monotonic() + 10
    while not any(r.job_id == job_id and r.success for r in tier.get_finished_jobs()):
        assert time.monotonic() < deadline, f"store {job_id} never finished"
        time.sleep(0.005)


def kept_blocks(tier: Any, want: int, timeout: float = 10.0) -> int:
    """The blocks the fs tier holds kept (its kept bytes over a block's stored size), once
    they reach ``want`` (or the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = tier.chain.stats()["tiers"][0]["backend_stats"]
        kept = int(stats["kept_bytes"]) // (int(stats["used_bytes"]) // 3 or 1)
        if kept >= want or time.monotonic() > deadline:
            return kept
        time.sleep(0.01)


def test_a_request_with_the_keep_hint_has_its_blocks_kept(tier: Any) -> None:
    made, region = tier
    store(made, region, request("r1", ("kvtier.keep", "1")), 1)
    assert kept_blocks(made, 3) == 3
    assert made._keeper.kept == 3


def test_requests_without_it_keep_nothing(tier: Any) -> None:
    made, region = tier
    store(made, region, request("r1"), 1)  # no hints
    store(made, region, request("r2", ("kvtier.keep", "2")), 2)  # another version
    store(made, region, request("r3", ("other.retain", "1")), 3)  # another action
    time.sleep(0.3)
    assert kept_blocks(made, 1, timeout=0.2) == 0


def test_a_later_request_with_the_hint_keeps_blocks_already_held(tier: Any) -> None:
    made, region = tier
    store(made, region, request("r1"), 1)
    assert kept_blocks(made, 1, timeout=0.2) == 0
    store(made, region, request("r2", ("kvtier.keep", "1")), 2)  # stores nothing new
    assert kept_blocks(made, 3) == 3


def test_blocks_stored_over_ones_that_failed_to_load_are_kept(tier: Any,
                                                              tmp_path: Path) -> None:
    """A store over blocks that failed to load runs on the tier's repair thread, not as a
    chain job: the hint's marks wait for it, so they find the new blocks held."""
    from vllm.v1.kv_offload.tiering.base import TransferJob

    made, region = tier
    store(made, region, request("r1"), 1)
    for path in (tmp_path / "store").rglob("*.kvb"):  # the blocks go behind the tier's back
        if path.stat().st_size > ROW:
            path.unlink()
    made.submit_load(TransferJob(2, KEYS, np.array([3, 4, 5], dtype=np.int32), True,
                                 request("r2")))
    deadline = time.monotonic() + 10
    while not any(r.job_id == 2 and not r.success for r in made.get_finished_jobs()):
        assert time.monotonic() < deadline, "the load never failed"
        time.sleep(0.005)
    store(made, region, request("r3", ("kvtier.keep", "1")), 3)  # replaces them
    assert kept_blocks(made, 3) == 3
