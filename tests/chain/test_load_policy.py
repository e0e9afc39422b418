"""The chain's load decision (load_policy: cost) against a tier slow on purpose.

The slow tier is the sample plugin's ``sample-slow`` backend, found through its
entry point: its gets take a time proportional to the bytes they return.
Reads measure each tier; ``prefix_hits`` then answers with what loads faster
than ``recompute`` says the engine would prefill it.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from sample_plugin import sample_plugin

import kvtier
from kvtier.chain import cost
from kvtier.plugins.registry import BackendRegistry

__all__ = ["sample_plugin"]

BLOCK = 64 * 1024
TOKENS = 16  # per block: recomputing one takes 16 ms at 1ms/token
SLOW = 1.0  # seconds per MiB: 62.5 ms a block
NS = kvtier.Namespace("load-policy", dtype="bfloat16", tokens_per_block=TOKENS)


def _payload(i: int) -> bytes:
    return bytes([i % 251]) * BLOCK


def _config(policy: str = "cost", delay: float = SLOW, hiccup: float = 0.0) -> dict[str, Any]:
    return {
        "chain": [
            {"name": "ram", "backend": "host", "capacity": "64MiB", "promote": False},
            {"name": "slow", "backend": "sample-slow", "delay_per_mib": delay,
             "hiccup": hiccup},
        ],
        "load_policy": policy,
        "recompute": "1ms/token",
    }


@pytest.fixture
def open_slow(sample_plugin: str) -> Iterator[Any]:
    registry = BackendRegistry()
    chains: list[kvtier.Chain] = []

    def open_(config: dict[str, Any]) -> kvtier.Chain:
        chain = kvtier.open_chain(config, namespace=NS, registry=registry)
        chains.append(chain)
        return chain

    yield open_
    for chain in chains:
        chain.close()


def _split(chain: kvtier.Chain, keys: list[bytes], in_ram: int) -> None:
    """Every block in the slow tier, the first ``in_ram`` in RAM too (asked of each
    tier, not of the chain, whose lookup would measure the tiers)."""
    assert chain.put(keys, [_payload(i) for i in range(len(keys))]) == [True] * len(keys)
    assert chain.flush(30)
    chain.tiers[0].evict(keys[in_ram:])
    assert chain.tiers[0].lookup(keys) == [True] * in_ram + [False] * (len(keys) - in_ram)
    assert chain.tiers[1].lookup(keys) == [True] * len(keys)


def _load(chain: kvtier.Chain, keys: list[bytes]) -> None:
    """What an engine does with the answer: read the blocks, byte for byte."""
    out = [bytearray(BLOCK) for _ in keys]
    assert chain.get(keys, out) == [True] * len(keys)
    assert out == [_payload(i) for i in range(len(keys))]


@pytest.mark.parametrize(("policy", "delay", "answer"),
                         [("cost", SLOW, 3), ("always", SLOW, 8), ("cost", 0.0, 8)])
def test_a_fast_start_is_loaded_and_a_slow_rest_left_to_recompute(
    open_slow: Any, policy: str, delay: float, answer: int
) -> None:
    chain = open_slow(_config(policy, delay))
    keys = [b"key-%d" % i for i in range(8)]
    _split(chain, keys, in_ram=3)
    # a fresh chain: its lookup measures each tier by reading one block of it, and
    # a second where the first says the tier is slower than recomputing
    assert chain.prefix_hits(keys) == answer
    slow = chain.stats()["tiers"][1]
    probes = 0 if policy == "always" else 1 if delay == 0 else 2
    assert (slow["probes"], slow["hits"]) == (probes, probes)  # no more blocks read
    _load(chain, keys)  # measures both tiers with a whole load
    assert chain.prefix_hits([*keys, b"absent"]) == answer
    slow = chain.stats()["tiers"][1]
    declined = 2 * (8 - answer)  # by both answers
    assert (slow["declined"], slow["declined_tokens"]) == (declined, declined * TOKENS)
    assert slow["probes"] == probes  # measured now: not probed again
    assert slow["load_cost"]["measured"]
    assert (slow["load_cost"]["block_s"] > 0.05) == (delay > 0)


def test_one_delayed_read_does_not_have_a_fast_tier_declined(open_slow: Any) -> None:
    # the first read of the fast tier takes 100 ms (recomputing a block, 16 ms): the
    # second is read before the tier is judged, and the faster read counts
    chain = open_slow(_config("cost", 0.0, hiccup=0.1))
    keys = [b"key-%d" % i for i in range(8)]
    _split(chain, keys, in_ram=3)
    assert chain.prefix_hits(keys) == 8
    slow = chain.stats()["tiers"][1]
    assert (slow["probes"], slow["hits"], slow["declined"]) == (2, 2, 0)
    assert slow["load_cost"]["block_s"] < 0.05
    _load(chain, keys)


def test_events_carry_the_expected_block_load_time_of_their_tier(open_slow: Any) -> None:
    chain = open_slow(_config())
    events: list[Any] = []
    chain.add_listener(events.append)
    keys = [b"key-%d" % i for i in range(4)]
    _split(chain, keys, in_ram=0)
    stored = [(e.tier, e.reason, e.load_s) for e in events if e.kind == "stored"]
    assert stored == [("ram", "put", 0.0), ("slow", "through", 0.0)]  # nothing measured yet
    _load(chain, keys)
    events.clear()
    assert chain.evict(keys) == 4
    block_s = chain.stats()["tiers"][1]["load_cost"]["block_s"]
    assert block_s > 0.05
    assert [(e.tier, e.kind, e.keys, e.load_s) for e in events] == [
        ("slow", "removed", tuple(keys), pytest.approx(block_s, rel=0.05))]


def test_tokens_per_block_weigh_the_load_against_more_compute(open_slow: Any) -> None:
    chain = open_slow(_config())
    keys = [b"key-%d" % i for i in range(4)]
    _split(chain, keys, in_ram=0)
    _load(chain, keys)
    assert chain.prefix_hits(keys) == 0
    assert chain.prefix_hits(keys, tokens_per_block=1024) == 4  # a second a block to recompute


def test_without_a_recompute_model_every_hit_is_loaded_and_stats_say_so(
    open_slow: Any
) -> None:
    config = _config()
    del config["recompute"]
    chain = open_slow(config)
    keys = [b"key-%d" % i for i in range(4)]
    _split(chain, keys, in_ram=0)
    _load(chain, keys)
    assert chain.prefix_hits(keys) == 4
    assert chain.stats()["load_policy"] == "always (no recompute model configured)"


class Clock:
    """The fits' clock: half a second passes between two requests."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_decision_flips_when_the_tier_slows_and_back_when_it_recovers(
    open_slow: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(cost, "_clock", clock)
    config = {**_config(delay=0.0), "cost_half_life": "1s"}
    config["chain"] = config["chain"][1:]  # the slow tier alone
    chain = open_slow(config)
    backend = chain.tiers[0].handle.instance
    keys = [b"key-%d" % i for i in range(4)]
    assert chain.put(keys, [_payload(i) for i in range(4)]) == [True] * 4

    def request() -> int:
        """One prompt: ask, load what the answer says, half a second later the next."""
        clock.now += 0.5
        n = chain.prefix_hits(keys)
        if n:
            _load(chain, keys[:n])
        return n

    assert [request() for _ in range(10)] == [4] * 10
    backend.delay_per_mib = SLOW  # 250 ms for the 4 blocks, 64 ms to recompute them
    answers = [request() for _ in range(5)]
    assert answers[0] == 4 and answers[1:] == [0] * 4  # one slow load, then declined
    backend.delay_per_mib = 0.0
    answers = [request() for _ in range(20)]
    # nothing is read from the tier until its fit, the slow read among 10 fast
    # ones (weight 3.3), decays below 1/8 of a read: 10 requests (5 half-lives)
    # after the slow read; then it is trusted, measured fast, and loaded again
    back = answers.index(4)
    assert answers[:back] == [0] * back and answers[back:] == [4] * (20 - back)
    assert back == 5, answers


def test_prometheus_exports_each_tiers_block_load_time_what_it_declined_and_probed(
    open_slow: Any
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    chain = open_slow({**_config(), "metrics": {"prometheus_port": port}})
    keys = [b"key-%d" % i for i in range(8)]
    _split(chain, keys, in_ram=3)
    assert chain.prefix_hits(keys) == 3  # the slow tier measured by two blocks
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    labels = f'backend="sample-slow",namespace="{NS.hex}",tier="slow"'
    assert f"kvtier_tier_declined_blocks_total{{{labels}}} 5.0" in text
    assert f"kvtier_tier_declined_tokens_total{{{labels}}} 80.0" in text
    assert f"kvtier_tier_probed_blocks_total{{{labels}}} 2.0" in text
    line = next(x for x in text.splitlines()
                if x.startswith(f"kvtier_tier_block_load_seconds{{{labels}}}"))
    block_s = chain.stats()["tiers"][1]["load_cost"]["block_s"]
    assert float(line.split()[-1]) == pytest.approx(block_s, rel=1e-6) and block_s > 0.05
