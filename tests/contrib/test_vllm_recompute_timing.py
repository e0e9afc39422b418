"""What the vLLM tier times as a recompute (kvtier.contrib.vllm.recompute_timing).

Unit tests on recorded sequences of the calls vLLM's tiering manager makes
(lookup answers, store jobs, per request): which intervals reach the chain's
recompute model, and which are marked as overlapped.  The model here is a
recorder; the engine test is tests/contrib/test_vllm_learned_recompute.py.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)


@dataclass
class Request:
    req_id: str


@dataclass
class Job:
    req_context: Request


class Model:
    def __init__(self) -> None:
        self.seen: list[tuple[int, float, bool]] = []
        self.machines: list[dict[str, Any]] = []

    def observe(self, tokens: int, seconds: float, overlapped: bool = False) -> bool:
        self.seen.append((tokens, round(seconds, 6), overlapped))
        return not overlapped

    def identify(self, machine: dict[str, Any]) -> None:
        self.machines.append(machine)


class Chain:
    def __init__(self) -> None:
        self.recompute = Model()


@dataclass
class Namespace:
    tokens_per_block: int


def timer() -> Any:
    from kvtier.contrib.vllm.recompute_timing import RecomputeTimer

    return RecomputeTimer(Namespace(32), None)


def test_a_miss_then_its_store_is_one_sample_per_token_of_the_stored_blocks() -> None:
    from kvtier.contrib.vllm._compat import LookupResult

    t, chain = timer(), Chain()
    a = Request("a")
    assert t.looked_up(chain, a, LookupResult.RETRY, 0.0) is LookupResult.RETRY
    assert t.looked_up(chain, a, LookupResult.MISS, 1.0) is LookupResult.MISS
    t.looked_up(chain, a, LookupResult.MISS, 1.5)  # asked again: the first miss counts
    t.step()  # the step that scheduled it ends: vLLM computes
    t.stored(chain, Job(a), 64, 3.0)
    t.stored(chain, Job(a), 1, 9.0)  # a decode step's block: no recompute
    assert chain.recompute.seen == [(64 * 32, 2.0, False)]
    assert len(chain.recompute.machines) == 1  # named once per chain
    assert chain.recompute.machines[0]["workers"] == 1


def test_overlapping_recomputes_and_loads_are_marked() -> None:
    from kvtier.contrib.vllm._compat import LookupResult

    t, chain = timer(), Chain()
    a, b, c, d = (Request(x) for x in "abcd")
    t.looked_up(chain, a, LookupResult.MISS, 0.0)
    t.looked_up(chain, b, LookupResult.MISS, 0.5)  # batched or queued with a
    t.step()
    t.stored(chain, Job(a), 10, 2.0)  # b still open
    t.stored(chain, Job(b), 10, 3.0)  # a ended after b began
    t.looked_up(chain, c, LookupResult.HIT, 5.0)  # c loads its start ...
    t.looked_up(chain, c, LookupResult.MISS, 5.0)  # ... and computes the rest
    t.step()
    t.stored(chain, Job(c), 10, 6.0)
    t.looked_up(chain, d, LookupResult.MISS, 7.0)  # alone
    t.step()
    t.stored(chain, Job(d), 10, 8.0)
    assert [s[2] for s in chain.recompute.seen] == [True, True, True, False]


def test_a_recompute_while_another_request_loads_is_marked() -> None:
    """b's load (a hit) begins while a recomputes: a's time holds b's reads and b's
    compute after its hit, so it is no measure of a's own; a load that began before
    a's miss, or after a's store, leaves a's time alone."""
    from kvtier.contrib.vllm._compat import LookupResult

    t, chain = timer(), Chain()
    a, b, c, d = (Request(x) for x in "abcd")
    t.looked_up(chain, c, LookupResult.HIT, 0.0)  # c loads, before a's miss
    t.looked_up(chain, a, LookupResult.MISS, 1.0)
    t.step()
    t.looked_up(chain, b, LookupResult.HIT, 1.5)  # b's load begins while a computes
    t.stored(chain, Job(a), 10, 3.0)
    t.looked_up(chain, d, LookupResult.MISS, 10.0)
    t.step()
    t.stored(chain, Job(d), 10, 11.0)  # c and b began loading before d's miss
    assert chain.recompute.seen == [(320, 2.0, True), (320, 1.0, False)]


def test_a_store_without_a_miss_or_a_chain_not_open_teaches_nothing() -> None:
    from kvtier.contrib.vllm._compat import LookupResult

    t, chain = timer(), Chain()
    t.stored(chain, Job(Request("x")), 10, 1.0)  # stored, never missed (a prior hit)
    t.looked_up(chain, Request("z"), LookupResult.MISS, 1.0)
    t.stored(chain, Job(Request("z")), 10, 1.5)  # in the step of its miss: nothing computed
    assert t._open == {}
    t.looked_up(object(), Request("y"), LookupResult.MISS, 1.0)  # an unopened stand-in
    t.stored(object(), Job(Request("y")), 10, 2.0)
    assert chain.recompute.seen == []
