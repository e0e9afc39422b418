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


class LearningChain:
    """A chain stand-in holding the real learned model (kept in no tier)."""

    def __init__(self) -> None:
        from kvtier.chain.learned_cost import RecomputeModel

        self.recompute = RecomputeModel()


def test_the_model_learns_the_lone_recomputes_and_ignores_the_queued_ones() -> None:
    """Timer and learner together, on one recorded sequence of calls: five recomputes
    alone at about 1 ms a token; then two requests batched (each waits for the other's
    tokens: 2 ms a token), and one during another request's load.  The model holds the
    five alone, and their low quantile."""
    from kvtier.contrib.vllm._compat import LookupResult

    t, chain = timer(), LearningChain()
    clock = 0.0
    lone = [1.05e-3, 1.0e-3, 1.2e-3, 1.1e-3, 1.02e-3]  # seconds a token, alone
    for n, rate in enumerate(lone):
        req = Request(f"alone-{n}")
        t.looked_up(chain, req, LookupResult.MISS, clock)
        t.step()
        t.stored(chain, Job(req), 64, clock + 64 * 32 * rate)
        clock += 10.0
    x, y = Request("x"), Request("y")  # batched: both open at once
    t.looked_up(chain, x, LookupResult.MISS, clock)
    t.looked_up(chain, y, LookupResult.MISS, clock)
    t.step()
    t.stored(chain, Job(x), 64, clock + 64 * 32 * 2e-3)
    t.stored(chain, Job(y), 64, clock + 64 * 32 * 2e-3 + 0.1)
    clock += 10.0
    z, w = Request("z"), Request("w")  # w's load begins while z computes
    t.looked_up(chain, z, LookupResult.MISS, clock)
    t.step()
    t.looked_up(chain, w, LookupResult.HIT, clock + 0.5)
    t.stored(chain, Job(z), 64, clock + 64 * 32 * 1.6e-3)
    stats = chain.recompute.summary()
    assert (stats["source"], stats["samples"], stats["dropped"]) == ("learned", 5, 3)
    assert stats["per_token_s"] == pytest.approx(min(lone))


def test_the_machine_named_changes_with_torchs_threads() -> None:
    """Another thread count is another machine: what was learned there is not used."""
    import torch

    from kvtier.contrib.vllm.recompute_timing import engine_machine

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = engine_machine(None)
        torch.set_num_threads(2)
        two = engine_machine(None)
    finally:
        torch.set_num_threads(before)
    assert (one["threads"], two["threads"]) == (1, 2)
    assert {k: v for k, v in one.items() if k != "threads"} == {
        k: v for k, v in two.items() if k != "threads"}
