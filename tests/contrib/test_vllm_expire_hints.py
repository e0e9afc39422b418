"""vLLM's ``kv_hints`` action ``kvtier.expire`` (version 1, payload ``{"after": D}``): the
blocks a request with it stores get a deadline in its tenant's chain.

The parsing is checked on a stand-in of vLLM's ``ReqContext`` (its ``kv_hints``,
``get_state`` and ``set_state``): a bad payload is ignored with one log line, never an
error.  The tier is then driven as vLLM's scheduler drives it, with vLLM 0.32's own
``ReqContext``, hint classes and ``TransferJob``, on a real ``fs`` tier: the hinted
request's blocks are gone once past the deadline, another request's stay byte for byte.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_chain import SpecStub, write_yaml

from kvtier.contrib.vllm.hints import RequestHints, keeps, retention

ROW = 4096


@dataclass
class Action:
    action_type: str
    action_version: str
    payload: Any = None


@dataclass
class Envelope:
    actions: list[Action]


@dataclass
class Context:
    """What the tier reads of vLLM's ``ReqContext``."""

    req_id: str
    kv_hints: Envelope | None
    state: dict[type, Any] = field(default_factory=dict)

    def get_state(self, kind: type) -> Any:
        return self.state.get(kind)

    def set_state(self, value: Any) -> None:
        self.state[type(value)] = value


def hinted(*actions: Action) -> Context:
    return Context("r", Envelope(list(actions)))


@pytest.mark.parametrize(("payload", "seconds"), [
    ({"after": 600}, 600.0), ({"after": "10m"}, 600.0), ({"after": 0.25}, 0.25),
    ({"after": "250ms"}, 0.25)])
def test_the_payload_gives_the_deadline(payload: Any, seconds: float) -> None:
    assert retention(hinted(Action("kvtier.expire", "1", payload))) == RequestHints(
        keep=False, expire_after=seconds)


def test_keep_and_expire_together_and_the_earliest_deadline_holds() -> None:
    context = hinted(Action("kvtier.expire", "1", {"after": "1h"}), Action("kvtier.keep", "1"),
                     Action("kvtier.expire", "1", {"after": 30}))
    assert retention(context) == RequestHints(keep=True, expire_after=30.0)
    assert keeps(context)


@pytest.mark.parametrize("payload", [
    None, {}, {"after": 0}, {"after": -5}, {"after": "soon"}, {"after": True},
    {"after": float("inf")}, {"after": 10, "unused": 5}, [10], "10m", 10])
def test_a_bad_payload_is_ignored_with_one_log_line(
        payload: Any, caplog: pytest.LogCaptureFixture) -> None:
    context = hinted(Action("kvtier.expire", "1", payload))
    with caplog.at_level(logging.WARNING, logger="kvtier.vllm"):
        assert not retention(context)
        assert not retention(context)  # decided once per request: no second line
    lines = [r for r in caplog.records if "kvtier.expire" in r.getMessage()]
    assert len(lines) == 1, caplog.text


def test_other_versions_and_actions_ask_nothing() -> None:
    assert not retention(hinted(Action("kvtier.expire", "2", {"after": 5}),
                                Action("other.expire", "1", {"after": 5})))
    assert not retention(Context("r", None))
    assert not retention(object())  # no kv_hints at all


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[tuple[Any, np.ndarray]]:
    pytest.importorskip("vllm")
    from kvtier.contrib.vllm.tier import KvtierTier

    config = write_yaml(tmp_path / "tiers.yaml", [{
        "name": "disk", "backend": "fs", "url": str(tmp_path / "store"), "capacity": "4MiB"}])
    region = np.zeros((8, ROW), dtype=np.uint8)
    made = KvtierTier(SpecStub(ROW, ("layers.0.attn", "layers.1.attn")),
                      memoryview(region), "KvtierTier", config=str(config))
    yield made, region
    made.shutdown()


def request(req_id: str, payload: Any = None) -> Any:
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope
    from vllm.v1.kv_offload.base import ReqContext

    if payload is None:
        return ReqContext(req_id=req_id, kv_hints=None)
    hints = KvHintsEnvelope(protocol_version="1", message_id=req_id, actions=[
        KvHintAction(action_id=f"{req_id}-0", action_type="kvtier.expire",
                     action_version="1", payload=payload)])
    return ReqContext(req_id=req_id, kv_hints=hints)


def store(tier: Any, region: np.ndarray, req: Any, job_id: int, keys: list[bytes]) -> None:
    from vllm.v1.kv_offload.tiering.base import TransferJob

    for c in range(len(keys)):
        region[c] = job_id + c
    chunks = np.arange(len(keys), dtype=np.int32)
    tier.submit_store(TransferJob(job_id, keys, chunks, False, req))
    deadline = time.monotonic() + 10
    while not any(r.job_id == job_id and r.success for r in tier.get_finished_jobs()):
        assert time.monotonic() < deadline, f"store {job_id} never finished"
        time.sleep(0.005)


def held(tier: Any, keys: list[bytes], job_id: int) -> list[bool]:
    """Per key, whether the chain reads back the exact rows the store wrote."""
    from kvtier.contrib.vllm.keys import chain_key

    got = tier.chain.get_bytes([chain_key(k) for k in keys])
    out = []
    for c, data in enumerate(got):
        if data is not None:
            assert bytes(data) == bytes([job_id + c]) * ROW, c  # the row the store read
        out.append(data is not None)
    return out


def test_a_request_with_the_expire_hint_has_its_blocks_expire(tier: Any) -> None:
    made, region = tier
    due, other = [bytes([1, i]) * 18 for i in range(2)], [bytes([2, i]) * 18 for i in range(2)]
    start = time.monotonic()
    store(made, region, request("r1", {"after": "1s"}), 1, due)
    store(made, region, request("r2"), 2, other)
    waited = time.monotonic() + 10
    while made._keeper.expiring < 2:  # the deadlines are given on the keeper's thread
        assert time.monotonic() < waited, "the deadlines were never given"
        time.sleep(0.01)
    given = time.monotonic()  # the deadline is no later than given + 1 s
    if given - start < 0.8:
        assert held(made, due, 1) == [True, True]
    time.sleep(max(0.0, given + 1.05 - time.monotonic()))
    assert held(made, due, 1) == [False, False]
    assert held(made, other, 2) == [True, True]
