"""vLLM KV-event logs: recorded from vLLM's own publisher, read back as requests for the plan."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvtier.cli import cli
from kvtier.plan import read_trace
from kvtier.plan.vllm_events import record_events


def stored(hashes: list[int], parent: int | None, **extra: Any) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "block_size": 16, "tokens": 16 * len(hashes), "medium": "GPU", **extra}


def write_log(path: Path, *batches: list[dict[str, Any]]) -> Path:
    lines = [{"kvtier_events": 1, "endpoint": "ipc://x", "topic": ""}]
    lines += [{"t": float(i), "seq": i, "rank": 0, "events": b} for i, b in enumerate(batches)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_stored_events_make_requests_through_their_parents(tmp_path: Path) -> None:
    path = write_log(
        tmp_path / "events.jsonl",
        # A: a first chunk, then a second continuing it (its parent is A's last block)
        [stored([1, 2], None, session_id="s"), stored([3], 2)],
        # B reused A's first two blocks from the GPU cache (no event for them): 1, 2, 4
        [stored([4], 2), {"type": "BlockRemoved", "block_hashes": [4], "medium": "GPU"}],
        # continues A's tail: read as A's (a new request there cannot be told apart);
        # then one whose parent the log never saw, and events of another medium and group
        [stored([5], 3), stored([9], 77), stored([1, 2, 3], None, medium="CPU"),
         stored([8], None, group_idx=1), {"type": "AllBlocksCleared"}],
        # vLLM's report mode "full": a hit's reused blocks come first, parent None
        [stored([1, 2], None, session_id="t"), stored([6], 2)],
    )
    trace = read_trace(path)
    assert [r.keys for r in trace.requests] == [(1, 2, 3, 5), (1, 2, 4), (77, 9), (1, 2, 6)]
    assert [r.session for r in trace.requests] == ["s", None, None, "t"]
    assert trace.block_tokens == 16 and trace.requests[0].tokens == (16,) * 4
    result = CliRunner().invoke(cli, ["plan", str(path), "--json", "--capacity", "10"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["curves"]["lru"][0]["prefix_hits"] == 4  # 1, 2 twice


def test_a_malformed_event_line_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write_log(tmp_path / "events.jsonl", [stored([1], None)],
                     [stored(["1"], None)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"events.jsonl:3: a BlockStored event needs integer"):
        read_trace(path)


def test_the_recorder_writes_what_vllms_publisher_sends(tmp_path: Path) -> None:
    pytest.importorskip("zmq")
    kv_events = pytest.importorskip("vllm.distributed.kv_events")
    base = f"ipc://{tmp_path}/{uuid.uuid4().hex[:8]}"
    publisher = kv_events.ZmqEventPublisher(0, endpoint=base + "-pub",
                                            replay_endpoint=base + "-replay")
    try:
        first = kv_events.BlockStored(
            block_hashes=[11, 12], parent_block_hash=None, token_ids=list(range(32)),
            block_size=16, lora_id=None, medium="GPU", lora_name=None, session_id="conv-1")
        second = kv_events.BlockStored(
            block_hashes=[(1 << 64) - 1], parent_block_hash=12, token_ids=list(range(16)),
            block_size=16, lora_id=None, medium="GPU", lora_name=None)
        removed = kv_events.BlockRemoved(block_hashes=[b"\x01\x02"], medium="GPU")
        publisher.publish(kv_events.KVEventBatch(ts=100.5, events=[first]))
        publisher.publish(kv_events.KVEventBatch(ts=101.0, events=[second, removed,
                                                                   kv_events.AllBlocksCleared()]))
        out = tmp_path / "events.jsonl"
        # published before anyone subscribed: the replay socket hands them over
        stats = record_events(base + "-pub", out, replay=base + "-replay", batches=2, seconds=30)
    finally:
        publisher.shutdown()
    assert (stats.batches, stats.events, stats.skipped, stats.missed) == (2, 4, 0, 0)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0] == {"kvtier_events": 1, "endpoint": base + "-pub", "topic": ""}
    assert lines[1] == {"t": 100.5, "seq": 0, "rank": 0, "events": [{
        "type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None,
        "block_size": 16, "medium": "GPU", "group_idx": None, "session_id": "conv-1",
        "tokens": 32}]}
    assert lines[2]["events"] == [
        {"type": "BlockStored", "block_hashes": [(1 << 64) - 1], "parent_block_hash": 12,
         "block_size": 16, "medium": "GPU", "group_idx": None, "session_id": None,
         "tokens": 16},
        {"type": "BlockRemoved", "block_hashes": [0x0102], "medium": "GPU", "group_idx": None},
        {"type": "AllBlocksCleared"},
    ]
    assert "token_ids" not in out.read_text()
    trace = read_trace(out)
    assert [r.keys for r in trace.requests] == [(11, 12, (1 << 64) - 1)]
    assert trace.requests[0].session == "conv-1"


def test_undecodable_batches_and_events_are_skipped() -> None:
    import msgpack

    from kvtier.plan.vllm_events import decode_batch

    assert decode_batch(b"\xc1", 0) == (None, 0)  # not msgpack
    assert decode_batch(msgpack.packb([1.0, 2, 3]), 0) == (None, 0)  # events not a list
    payload = msgpack.packb([1.0, [{"type": "Bogus"}, {"type": "BlockStored",
                                                      "block_hashes": "12"},
                                   {"type": "BlockRemoved", "block_hashes": [1.5]},
                                   {"type": "AllBlocksCleared"}]])
    assert decode_batch(payload, 7) == (
        {"t": 1.0, "seq": 7, "rank": None, "events": [{"type": "AllBlocksCleared"}]}, 3)
