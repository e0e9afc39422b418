"""RAM over a tier below, with the chain's admission: exact on small traces, bounded on large."""

from __future__ import annotations

import pytest

from kvtier.plan import Request, Trace, generate, infinite_point
from kvtier.plan.below import replay_below


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
