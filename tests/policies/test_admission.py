"""admit: N on a tier below the first: blocks reach it only once their keys were seen N times."""

from __future__ import annotations

import random
import socket
import urllib.request
import uuid

import pytest

from kvtier import Namespace, open_chain
from kvtier.config.chain_config import validate_config
from kvtier.policies.admission import Lineage, Seen

NS = Namespace("admission-test", dtype="bfloat16", tokens_per_block=16)
SIZE = 4096


def payload(key: bytes) -> bytes:
    return (key * (SIZE // len(key) + 1))[:SIZE]


def chain_config(write: str, admit: int, **below: object) -> dict[str, object]:
    return {"chain": [
        {"name": "ram", "backend": "host", "capacity": 2 * SIZE + 200, "prefault": 0},
        {"name": "disk", "backend": "fs", "url": f"memory://admit-{uuid.uuid4().hex}",
         "write": write, "admit": admit, **below},
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


SYSTEM = [b"system-%d" % i for i in range(3)]


def conversation(n: int, turn: int) -> list[bytes]:
    """Turn ``turn`` of conversation ``n``: the system prompt, then two blocks a turn so far."""
    return SYSTEM + [b"conv-%d-%d" % (n, i) for i in range(2 * turn)]


def test_a_lineage_draw_is_shared_by_a_conversation_s_turns() -> None:
    seen = Seen()
    lineage = Lineage(seen)

    def call(keys: list[bytes]) -> None:  # as the chain notes each call
        seen.note(keys)
        lineage.note(keys)

    for n in range(3):  # three prompts (lookup, get, put) make the system prompt shared
        call(conversation(n, 1))
        call(SYSTEM)
        call(conversation(n, 1)[3:])
    call(conversation(0, 2))  # the next turn: history, then two new blocks
    call(conversation(0, 2)[:5])
    call(conversation(0, 2)[5:])
    draws = [lineage.draw(k) for k in conversation(0, 2)[3:]]
    assert len(set(draws)) == 1  # the new turn joined its history's lineage
    call(conversation(9, 1))  # after a shared prefix: a lineage of its own
    assert lineage.draw(b"conv-9-0") == lineage.draw(b"conv-9-1") == Lineage(Seen()).draw(
        b"conv-9-0")
    # the first prompts met the system prompt before it was shared: they joined its lineage
    firsts = {lineage.draw(k) for k in (SYSTEM[0], b"conv-0-0", b"conv-1-0", b"conv-2-0")}
    assert firsts == {Lineage(Seen()).draw(SYSTEM[0])} and lineage.draw(b"conv-9-0") not in firsts
    assert lineage.sampled(b"conv-0-3", 1.0) and not lineage.sampled(b"conv-0-3", 0.0)


def test_a_key_that_lost_its_slot_is_drawn_afresh() -> None:
    lineage = Lineage(Seen(), slot_bits=0)  # one slot: every new key takes it
    own = Lineage(Seen()).draw
    assert own(b"parent") != own(b"child")
    lineage.note([b"parent", b"child"])
    assert lineage.draw(b"child") == own(b"parent")  # inherited, and holds the slot
    lineage.note([b"other"])
    assert lineage.draw(b"child") == own(b"child")  # its slot taken: its own hash again


@pytest.mark.parametrize("write", ["back", "through"])
def test_a_sampled_share_of_conversations_is_written_at_first_sight(write: str) -> None:
    seen = Seen()
    mirror = Lineage(seen)  # fed the chain's calls: the plan's replay draws the same way
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    config = {**chain_config(write, 3, admit_sample=0.5), "metrics": {"prometheus_port": port}}
    with open_chain(config, namespace=NS) as chain:
        def call(op: str, keys: list[bytes]) -> None:
            seen.note(keys)
            mirror.note(keys)
            if op == "lookup":
                chain.lookup(keys)
            elif op == "get":
                out = [bytearray(SIZE) for _ in keys]
                assert chain.get(keys, out) == [True] * len(keys)
            else:
                for key in keys:
                    chain.put([key], [payload(key)])

        for n in range(40):  # each conversation's first turn only: named once
            call("lookup", conversation(n, 2))
            if n:
                call("get", SYSTEM)
            call("put", conversation(n, 2) if n == 0 else conversation(n, 2)[3:])
        for key in (b"a", b"b", b"c"):  # push the last ones out of RAM
            chain.put([key], [payload(key)])
        chain.flush()
        disk = chain.tiers[1]
        kept = []
        for n in range(40):
            blocks = conversation(n, 2)[3:]
            below = disk.lookup(blocks)
            assert below in ([True] * 4, [False] * 4)  # a conversation is kept or not, whole
            assert below[0] == mirror.sampled(blocks[0], 0.5)
            if below[0]:
                kept.append(n)
                assert disk.get_payloads(blocks) == [payload(k) for k in blocks]
        assert 10 <= len(kept) <= 30, kept
        assert disk.stats.not_admitted >= 4 * (40 - len(kept)) - 8  # the last in RAM aside
        # every block of a kept conversation was named by one request: in by the sample
        # alone; so may be the system prompt at its first write, and the three pushers
        by_sample = disk.stats.sample_admitted
        assert 4 * len(kept) <= by_sample <= 4 * len(kept) + 6
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        labels = f'backend="fs",namespace="{NS.hex}",tier="disk"'
        assert f"kvtier_tier_sample_admitted_blocks_total{{{labels}}} {by_sample}.0" in (
            text.decode())
        assert (f"kvtier_tier_not_admitted_blocks_total{{{labels}}} "
                f"{disk.stats.not_admitted}.0") in text.decode()


@pytest.mark.parametrize(("entry", "below", "key", "reason"), [
    ({"admit": 2}, {}, "chain[0].admit", "'admit' has no meaning on the first tier"),
    ({}, {"admit": 0}, "chain[1].admit", "expected 1 (write every block) or more calls"),
    ({"admit_sample": 0.5}, {}, "chain[0].admit_sample",
     "'admit_sample' has no meaning on the first tier"),
    ({}, {"admit_sample": 1.5}, "chain[1].admit_sample", "expected a share from 0 to 1, got 1.5"),
    ({}, {"admit": 1, "admit_sample": 0.3}, "chain[1].admit_sample",
     "has no meaning with admit: 1"),
])
def test_admit_errors_name_the_key(entry: dict[str, object], below: dict[str, object], key: str,
                                   reason: str) -> None:
    config = {"chain": [
        {"name": "ram", "backend": "host", "capacity": 4096, **entry},
        {"name": "disk", "backend": "fs", "url": "memory://x", "admit": 2, **below},
    ]}
    loaded, problems = validate_config(config)
    assert loaded is None and len(problems) == 1
    assert problems[0].key == key and reason in str(problems[0])
