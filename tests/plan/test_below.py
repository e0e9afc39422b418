"""RAM over a tier below, with the chain's admission: exact on small traces, bounded on large;
an S3-FIFO tier below equals a plain simulation."""

from __future__ import annotations

from typing import Any

import pytest

from kvtier.plan import Request, Trace, generate, infinite_point
from kvtier.plan.below import replay_below
from kvtier.plan.curves import BLOCK_SCALE
from kvtier.policies import S3Fifo, new_policy
from kvtier.policies.admission import Seen


def trace_of(*requests: tuple[int, ...]) -> Trace:
    return Trace([Request(keys, (1,) * len(keys)) for keys in requests])


@pytest.mark.parametrize(("write", "admit", "from_below", "written"), [
    ("back", 1, 1, 2),  # A demoted by B, read back; B demoted by A's promotion
    ("back", 3, 0, 0),  # A and B were each named by one request (2 calls) when evicted
    ("through", 1, 1, 2),  # A and B written at their puts; the promotion goes no further
    ("through", 3, 0, 1),  # A's second put (its 4th call) is admitted and written
])
def test_a_three_request_trace(write: str, admit: int, from_below: int, written: int) -> None:
    point = replay_below(trace_of((1,), (2,), (1,)), "lru", 1, 10, write, admit)
    assert (point.from_ram, point.from_below, point.written_below) == (0, from_below, written)


def test_writes_below_that_no_read_used_are_counted() -> None:
    # A demoted by B and read back; B, demoted by A's promotion, never read
    point = replay_below(trace_of((1,), (2,), (1,)), "lru", 1, 10, "back", 1)
    assert (point.written_below, point.never_read) == (2, 1)
    # one block below: A pushed out unread by B, B by C, and C still unread at the end
    point = replay_below(trace_of((1,), (2,), (3,), (1,)), "lru", 1, 1, "back", 1)
    assert (point.from_below, point.written_below, point.never_read) == (0, 3, 3)
    assert point.never_read_share == 1.0


def test_a_second_request_admits_a_block_evicted_after_it() -> None:
    # A named by requests 1 and 2 (4 calls) before B and C push it out of RAM
    point = replay_below(trace_of((1,), (1,), (2,), (3,), (1,)), "lru", 1, 10, "back", 3)
    assert (point.from_ram, point.from_below) == (1, 1) and point.written_below == 1


@pytest.mark.parametrize("kind", ["prompts", "sessions", "documents"])
def test_a_tier_below_that_holds_everything_reaches_the_ceiling(kind: str) -> None:
    trace = generate(kind, 300, seed=1)
    point = replay_below(trace, "arc", 20, trace.unique_blocks, "through", 1)
    assert point.from_ram + point.from_below == infinite_point(trace).prefix_hits
    assert point.written_below == trace.unique_blocks


@pytest.mark.parametrize("kind", ["prompts", "documents", "scan"])
def test_admission_writes_less_below(kind: str) -> None:
    trace = generate(kind, 600, seed=2)
    every = replay_below(trace, "lru", 30, 300, "back", 1)
    fewer = replay_below(trace, "lru", 30, 300, "back", 3)
    assert fewer.written_below < every.written_below / 2
    # hits below may rise: one-off blocks no longer push reused ones out of it


# A plain simulation of an engine's calls: the RAM policy object over an S3Fifo object,
# fed the admits and accesses the chain makes; nothing of replay_below.
def plain_below(trace: Trace, ram_policy: str, ram: int, below: int, write: str,
                admit: int) -> tuple[int, int, int, int]:
    top: Any = new_policy(ram_policy, ram * BLOCK_SCALE)
    low: Any = S3Fifo(below * BLOCK_SCALE)
    seen = Seen()
    read: dict[int, bool] = {}  # held below: read since written
    from_ram = from_below = written = never_read = 0

    def name(key: int) -> bytes:
        return key.to_bytes(8, "little")

    def down(key: int) -> None:
        nonlocal written, never_read
        if seen.count(name(key)) >= admit and not low.access(key):
            gone = low.admit(key, BLOCK_SCALE)
            written += 1
            read[key] = False
            never_read += sum(not read.pop(k) for k in gone)

    def put(key: int, promoted: bool) -> None:
        if top.access(key):
            return
        out = top.admit(key, BLOCK_SCALE)
        if write == "through" and not promoted:
            down(key)
        if write == "back":
            for victim in out:
                down(victim)

    for request in trace.requests:
        keys = list(request.keys)
        seen.note([name(k) for k in keys])
        found = 0
        while found < len(keys):
            if top.access(keys[found]):
                from_ram += 1
            elif low.access(keys[found]):
                from_below += 1
                read[keys[found]] = True
                put(keys[found], True)
            else:
                break
            found += 1
        if found:
            seen.note([name(k) for k in keys[:found]])
        if found < len(keys):
            seen.note([name(k) for k in keys[found:]])
        for key in keys[found:]:
            put(key, False)
    return from_ram, from_below, written, never_read + sum(not r for r in read.values())


@pytest.mark.parametrize(("kind", "ram_policy"), [
    ("scan", "lru"), ("documents", "arc"), ("sessions", "s3fifo"), ("prompts", "adaptive"),
])
@pytest.mark.parametrize("write", ["back", "through"])
@pytest.mark.parametrize("admit", [1, 3])
def test_an_s3fifo_tier_below_equals_a_plain_simulation(
    kind: str, ram_policy: str, write: str, admit: int
) -> None:
    trace = generate(kind, 500, seed=5)
    point = replay_below(trace, ram_policy, 25, 140, write, admit, "s3fifo")
    assert point.below_eviction == "s3fifo"
    assert (point.from_ram, point.from_below, point.written_below,
            point.never_read) == plain_below(trace, ram_policy, 25, 140, write, admit)


def test_s3fifo_below_keeps_blocks_a_scan_would_push_out_of_lru() -> None:
    trace = generate("scan", 600, seed=1)
    lru = replay_below(trace, "lru", 20, 150, "back", 1)
    s3fifo = replay_below(trace, "lru", 20, 150, "back", 1, "s3fifo")
    assert lru.below_eviction == "lru" and lru.from_ram == s3fifo.from_ram
    assert s3fifo.from_below > lru.from_below and s3fifo.written_below < lru.written_below
    with pytest.raises(ValueError, match="lru or s3fifo, not 'fifo'"):
        replay_below(trace, "lru", 20, 150, "back", 1, "fifo")


@pytest.mark.parametrize(("kind", "more_below"), [
    ("sessions", True),  # turns that come back after RAM let them go: found below
    ("documents", False),  # sampled one-off blocks push popular ones out of 400 blocks
])
def test_a_sample_of_lineages_writes_between_admit_alone_and_every_block(
    kind: str, more_below: bool,
) -> None:
    trace = generate(kind, 1500, seed=3)
    every = replay_below(trace, "lru", 40, 400, "back", 1)
    alone = replay_below(trace, "lru", 40, 400, "back", 9)
    assert replay_below(trace, "lru", 40, 400, "back", 9, "lru", 0.0) == alone
    whole = replay_below(trace, "lru", 40, 400, "back", 9, "lru", 1.0)  # every lineage
    assert (whole.from_below, whole.written_below) == (every.from_below, every.written_below)
    half = replay_below(trace, "lru", 40, 400, "back", 9, "lru", 0.5)
    assert alone.written_below < half.written_below < every.written_below
    assert (half.from_below > alone.from_below) == more_below
    assert half.admission == "9, sample 0.5"
