"""admit: N on a tier below the first: blocks reach it only once their keys were seen N times."""

from __future__ import annotations

import random
import uuid

import pytest

from kvtier import Namespace, open_chain
from kvtier.chain.admission import Seen
from kvtier.config.loader import validate_config

NS = Namespace("admission-test", dtype="bfloat16", tokens_per_block=16)
SIZE = 4096


def payload(key: bytes) -> bytes:
    return (key * (SIZE // len(key) + 1))[:SIZE]


def chain_config(write: str, admit: int) -> dict[str, object]:
    return {"chain": [
        {"name": "ram", "backend": "host", "capacity": 2 * SIZE + 200, "prefault": 0},
        {"name": "disk", "backend": "fs", "url": f"memory://admit-{uuid.uuid4().hex}",
         "write": write, "admit": admit},
    ]}


@pytest.mark.parametrize("write", ["back", "through"])
def test_blocks_seen_once_are_not_written_below(write: str) -> None:
    hot, cold = [b"hot-%d" % i for i in range(3)], [b"cold-%d" % i for i in range(3)]
    with open_chain(chain_config(write, 2), namespace=NS) as chain:
        chain.lookup(hot)  # an engine asks first: the put is the second call naming them
        for key in hot + cold:
            assert chain.put([key], [payload(key)]) == [True]
        chain.put([b"a"], [payload(b"a")])  # pushes the last of them out of RAM
        chain.put([b"b"], [payload(b"b")])
        chain.flush()
        disk = chain.tiers[1]
        assert disk.lookup(hot) == [True, True, True]
        assert disk.lookup(cold) == [False, False, False]
        assert disk.stats.not_admitted >= 3
        out = [bytearray(SIZE) for _ in hot]
        assert chain.get(hot, out) == [True] * 3 and [bytes(o) for o in out] == [
            payload(k) for k in hot
        ]


def test_admit_one_writes_every_block_below() -> None:
    with open_chain(chain_config("back", 1), namespace=NS) as chain:
        keys = [b"k-%d" % i for i in range(6)]
        for key in keys:
            chain.put([key], [payload(key)])
        chain.flush()
        assert chain.tiers[1].lookup(keys[:4]) == [True] * 4
        assert chain.tiers[1].stats.not_admitted == 0


def test_the_sketch_never_counts_fewer_calls_and_halves_with_age() -> None:
    seen = Seen(width_bits=8)  # 256 counters a row: collisions are many
    rng = random.Random(2)
    truth: dict[bytes, int] = {}
    for _ in range(200):
        call = [b"%d" % rng.randrange(300) for _ in range(rng.randint(1, 5))]
        seen.note(call)
        for key in set(call):
            truth[key] = truth.get(key, 0) + 1
    assert all(seen.count(key) >= n for key, n in truth.items())
    before = seen.count(b"x")
    for _ in range(3000):  # past 10 x 256 counts: every counter halves
        seen.note([b"x"])
    assert seen.count(b"x") < before + 3000 and seen.count(b"x") <= 255


@pytest.mark.parametrize(("entry", "key", "reason"), [
    ({"admit": 2}, "chain[0].admit", "'admit' has no meaning on the first tier"),
    ({}, "chain[1].admit", "expected 1 (write every block) or more calls"),
])
def test_admit_errors_name_the_key(entry: dict[str, object], key: str, reason: str) -> None:
    config = {"chain": [
        {"name": "ram", "backend": "host", "capacity": 4096, **entry},
        {"name": "disk", "backend": "fs", "url": "memory://x", "admit": 0 if not entry else 2},
    ]}
    loaded, problems = validate_config(config)
    assert loaded is None and len(problems) == 1
    assert problems[0].key == key and reason in str(problems[0])
