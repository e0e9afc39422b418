"""kvtier.chain.traffic driven directly: what a settled write sends down, and Unsaved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtier import Namespace, open_chain
from kvtier.block import framing
from kvtier.chain.traffic import Traffic, Unsaved

NS = Namespace("traffic-test", dtype="bfloat16", tokens_per_block=32)


def test_unsaved_keeps_keys_per_tier_that_keeps_any() -> None:
    unsaved = Unsaved([True, False])
    unsaved.mark(0, [b"a", b"b", b"c"], True)
    unsaved.mark(0, [b"b"], False)  # saved below meanwhile
    unsaved.mark(1, [b"x"], True)  # a tier that keeps nothing unsaved ignores it
    assert sorted(unsaved.take(0)) == [b"a", b"c"]
    assert unsaved.take(0) == []  # handed out once
    assert unsaved.take(1) == []


def chain_config(tmp_path: Path, write: str) -> dict[str, Any]:
    return {"chain": [
        {"name": "ram", "backend": "host", "capacity": "1MiB"},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/disk", "write": write},
    ]}


def test_a_settled_put_goes_through_and_tells_listeners(tmp_path: Path) -> None:
    heard: list[tuple[str, int, list[bytes], str]] = []
    keys = [b"k0", b"k1", b"k2"]
    payloads = [bytes([i]) * 5000 for i in range(3)]
    with open_chain(chain_config(tmp_path, "through"), namespace=NS) as chain:
        traffic = Traffic(chain.tiers, 1 << 20, lambda kind, i, ks, why: heard.append(
            (kind, i, list(ks), why)))
        try:
            frames = [framing.encode(NS.fingerprint, k, p, chain.tiers[1].codec)
                      for k, p in zip(keys, payloads)]
            # k1 was refused by the tier above: only what it stored goes down
            traffic.settle(0, keys, [True, False, True], [], "put",
                           lambda j: frames[j], verify=True)
            assert traffic.flush(timeout=30)
        finally:
            traffic.shutdown()
        assert chain.tiers[1].lookup(keys) == [True, False, True]
        assert [chain.tiers[1].decode_bytes(k, b) if b is not None else None
                for k, b in zip(keys, chain.tiers[1].get_blobs(keys))] == [
            payloads[0], None, payloads[2]]
    assert heard[0] == ("stored", 0, [b"k0", b"k2"], "put")
    assert ("stored", 1, [b"k0", b"k2"], "through") in heard


def test_a_settled_put_waits_below_a_write_back_tier(tmp_path: Path) -> None:
    with open_chain(chain_config(tmp_path, "back"), namespace=NS) as chain:
        traffic = Traffic(chain.tiers, 1 << 20, lambda *args: None)
        try:
            traffic.settle(0, [b"k"], [True], [], "put",
                           lambda j: b"unused", verify=True)
            assert traffic.flush(timeout=30)
            # nothing went down yet; the RAM tier owes it to the tier below at close
            assert chain.tiers[1].lookup([b"k"]) == [False]
            assert traffic.unsaved.take(0) == [b"k"]
        finally:
            traffic.shutdown()
