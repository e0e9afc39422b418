"""A chain's ``record:`` trace: key hashes only, sampled by the first key, read back by plan."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import xxhash

from kvtier import Namespace, open_chain
from kvtier.config.chain_config import validate_config
from kvtier.plan import generate, read_trace, replay
from kvtier.spec import ConfigError

NS = Namespace("record-test", dtype="bfloat16", tokens_per_block=16)
PAYLOAD = 1024


def payload(key: bytes) -> bytes:
    return (key * (PAYLOAD // len(key) + 1))[:PAYLOAD]


def serve(chain: object, keys: list[bytes]) -> int:
    """What an engine does with one prompt: look up, load the cached prefix, store the rest."""
    where = chain.lookup(keys)  # type: ignore[attr-defined]
    prefix = next((i for i, tier in enumerate(where) if tier is None), len(keys))
    if prefix:
        out = [bytearray(PAYLOAD) for _ in range(prefix)]
        assert chain.get(keys[:prefix], out) == [True] * prefix  # type: ignore[attr-defined]
        assert all(bytes(o) == payload(k) for o, k in zip(out, keys))
    rest = keys[prefix:]
    if rest:
        chain.put(rest, [payload(k) for k in rest])  # type: ignore[attr-defined]
    return prefix


def frame_size() -> int:
    with open_chain({"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB",
                                "prefault": 0}]}, namespace=NS) as chain:
        chain.put([bytes(8)], [payload(bytes(8))])  # keys of 8 bytes: a frame holds its key
        return int(chain.stats()["tiers"][0]["backend_stats"]["used_bytes"])


def test_the_trace_holds_every_call_as_key_hashes_and_no_payload(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    config = {"record": str(path),
              "chain": [{"name": "ram", "backend": "host", "capacity": "1MiB", "prefault": 0}]}
    keys = [b"secret-key-%d" % i for i in range(3)]
    with open_chain(config, namespace=NS) as chain:
        serve(chain, keys)
        serve(chain, keys)
        chain.get_bytes(keys[:1])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0]["kvtier_trace"] == 1 and rows[0]["sample"] == 1.0
    assert rows[0]["block_tokens"] == 16
    hashes = [xxhash.xxh3_64_intdigest(k) for k in keys]
    assert [(r["op"], r["keys"]) for r in rows[1:]] == [
        ("lookup", hashes), ("put", hashes), ("lookup", hashes), ("get", hashes),
        ("get", hashes[:1]),
    ]
    raw = path.read_bytes()
    assert b"secret-key" not in raw and payload(keys[0])[:16] not in raw
    trace = read_trace(path)
    assert [r.keys for r in trace.requests] == [tuple(hashes)] * 2
    assert trace.block_tokens == 16


@pytest.mark.parametrize("eviction", ["lru", "arc", "s3fifo"])
def test_plan_replays_a_recording_to_the_chains_own_hits(tmp_path: Path, eviction: str) -> None:
    """The prefix hits plan finds in a recording equal those the recorded chain served."""
    path = tmp_path / "trace.jsonl"
    blocks = 40
    config = {"record": {"path": str(path), "sample": 1},
              "chain": [{"name": "ram", "backend": "host", "eviction": eviction,
                         "capacity": blocks * frame_size(), "prefault": 0}]}
    served = 0
    prompts = generate("prompts", 300, seed=5).requests
    with open_chain(config, namespace=NS) as chain:
        for prompt in prompts:
            keys = [k.to_bytes(8, "big") for k in dict.fromkeys(prompt.keys)]
            served += serve(chain, keys)
    point = replay(read_trace(path), eviction, blocks)
    assert served > 0 and point.prefix_hits == served


def test_sampling_keeps_the_calls_whose_first_key_hashes_low(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    config = {"record": {"path": str(path), "sample": 0.25},
              "chain": [{"name": "ram", "backend": "host", "capacity": "1MiB", "prefault": 0}]}
    rng = random.Random(1)
    calls = [[rng.randbytes(8) for _ in range(3)] for _ in range(400)]
    with open_chain(config, namespace=NS) as chain:
        for keys in calls:
            chain.lookup(keys)
    kept = [[xxhash.xxh3_64_intdigest(k) for k in keys] for keys in calls
            if xxhash.xxh3_64_intdigest(keys[0]) < (1 << 62)]
    trace = read_trace(path)
    assert trace.sample == 0.25 and [list(r.keys) for r in trace.requests] == kept
    assert 50 < len(kept) < 150
    # a second run appends: its header line is skipped
    sampled = next(keys for keys in calls if xxhash.xxh3_64_intdigest(keys[0]) < (1 << 62))
    with open_chain(config, namespace=NS) as chain:
        chain.lookup(sampled)
    again = read_trace(path).requests
    assert len(again) == len(kept) + 1 and list(again[-1].keys) == kept[0]


@pytest.mark.parametrize(("record", "key", "reason"), [
    ({"path": "x", "sample": 0}, "record.sample", "above 0 and at most 1"),
    ({"path": "x", "sample": 1.5}, "record.sample", "above 0 and at most 1"),
    ({"sample": 0.5}, "record.path", "missing"),
    ({"path": "x", "rate": 0.5}, "record.rate", "unknown key 'rate'"),
    (7, "record", "expected a path or a mapping"),
])
def test_record_config_errors_name_the_key(record: object, key: str, reason: str) -> None:
    config = {"record": record, "chain": [{"name": "ram", "backend": "host", "capacity": 4096}]}
    loaded, problems = validate_config(config)
    assert loaded is None and len(problems) == 1
    assert problems[0].key == key and reason in str(problems[0])


def test_an_unwritable_trace_path_is_a_config_error(tmp_path: Path) -> None:
    config = {"record": str(tmp_path / "missing-dir" / "t.jsonl"),
              "chain": [{"name": "ram", "backend": "host", "capacity": 4096}]}
    with pytest.raises(ConfigError, match=r"record\.path: cannot open the trace file"):
        open_chain(config, namespace=NS)
