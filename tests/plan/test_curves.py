"""kvtier plan's curves: LRU's one pass against a plain simulation, Belady against brute force."""

from __future__ import annotations

import random
from collections import OrderedDict
from functools import cache

import pytest

from kvtier.plan import (
    BLOCK_SCALE,
    INFINITE,
    Request,
    Trace,
    belady_hits,
    default_capacities,
    generate,
    infinite_point,
    lru_curve,
    replay,
)

KINDS = ("prompts", "sessions", "documents", "scan")


def random_trace(seed: int, requests: int = 60, keys: int = 40) -> Trace:
    """Short requests over few keys, repeats inside a request included."""
    rng = random.Random(seed)
    out = []
    for _ in range(requests):
        blocks = tuple(rng.randrange(keys) for _ in range(rng.randint(1, 8)))
        out.append(Request(blocks, tuple(rng.randint(1, 512) for _ in blocks)))
    return Trace(out)


def plain_lru(trace: Trace, capacity: int) -> tuple[int, int, int, int, int]:
    """LRU of ``capacity`` blocks, block by block: prefix, tokens, hits, puts, evictions."""
    cache: OrderedDict[int, None] = OrderedDict()
    prefix = tokens = hits = puts = evictions = 0
    for request in trace.requests:
        leading = True
        for key, weight in zip(request.keys, request.tokens):
            if key in cache:
                cache.move_to_end(key)
                hits += 1
                if leading:
                    prefix, tokens = prefix + 1, tokens + weight
                continue
            leading = False
            puts += 1
            cache[key] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
                evictions += 1
    return prefix, tokens, hits, puts, evictions


def traces() -> list[Trace]:
    return [random_trace(seed) for seed in range(4)] + [
        generate(kind, 300, seed=7) for kind in KINDS
    ]


@pytest.mark.parametrize("trace", traces(), ids=lambda t: t.source or "random")
def test_lru_curve_equals_a_plain_lru_simulation_to_the_hit(trace: Trace) -> None:
    unique = trace.unique_blocks
    capacities = sorted({1, 2, 3, 5, 8, *default_capacities(unique, 12), unique, unique + 9})
    curve = lru_curve(trace, capacities)
    for point in curve:
        expected = plain_lru(trace, point.capacity)
        got = (point.prefix_hits, point.prefix_tokens, point.block_hits, point.puts,
               point.evictions)
        assert got == expected, point.capacity
        # the host tier's own LRU object, replayed, agrees as well
        assert replay(trace, "lru", point.capacity) == point


@pytest.mark.parametrize("trace", traces()[:3], ids=lambda t: t.source or "random")
def test_the_ceiling_is_a_cache_that_never_evicts(trace: Trace) -> None:
    ceiling = lru_curve(trace, [INFINITE])[0]
    assert ceiling.capacity == INFINITE
    never = plain_lru(trace, trace.references + 1)
    assert (ceiling.prefix_hits, ceiling.prefix_tokens, ceiling.block_hits, ceiling.puts) == (
        never[:4]
    )
    assert ceiling.evictions == 0 and ceiling.puts == trace.unique_blocks
    assert infinite_point(trace) == ceiling


def brute_force_hits(keys: tuple[int, ...], capacity: int) -> int:
    """The most block hits any sequence of keep, bypass and evict choices can reach."""

    @cache
    def best(t: int, held: frozenset[int]) -> int:
        if t == len(keys):
            return 0
        key = keys[t]
        if key in held:
            return 1 + best(t + 1, held)
        options = [best(t + 1, held)]  # not kept
        if len(held) < capacity:
            options.append(best(t + 1, held | {key}))
        else:
            options.extend(best(t + 1, (held - {old}) | {key}) for old in held)
        return max(options)

    return best(0, frozenset())


@pytest.mark.parametrize("seed", range(12))
def test_belady_equals_brute_force_on_small_traces(seed: int) -> None:
    rng = random.Random(seed)
    keys = tuple(rng.randrange(rng.randint(3, 6)) for _ in range(rng.randint(6, 14)))
    trace = Trace([Request(keys[i : i + 3], (1,) * len(keys[i : i + 3]))
                   for i in range(0, len(keys), 3)])
    for capacity in range(0, 5):
        assert belady_hits(trace, capacity) == brute_force_hits(keys, capacity), capacity


@pytest.mark.parametrize("kind", KINDS)
def test_belady_bounds_every_policy(kind: str) -> None:
    trace = generate(kind, 400, seed=3)
    for capacity in default_capacities(trace.unique_blocks, 5):
        bound = belady_hits(trace, capacity)
        for policy in ("lru", "arc", "s3fifo"):
            point = replay(trace, policy, capacity)
            assert point.prefix_hits <= point.block_hits <= bound, (policy, capacity)
    ceiling = lru_curve(trace, [INFINITE])[0]
    assert belady_hits(trace, trace.unique_blocks) == ceiling.block_hits


def test_arc_replay_counts_what_the_host_tier_does() -> None:
    """The replayed ARC is the host tier's: an independent walk through its backend agrees."""
    from host_blocks import open_host

    # a put stores a key repeated in its batch once, so each request's keys are distinct here
    mixed = random_trace(11, requests=120, keys=30).requests
    trace = Trace([Request(tuple(dict.fromkeys(r.keys)), (1,) * len(set(r.keys))) for r in mixed])
    size, capacity = BLOCK_SCALE, 10  # the replay's block weight: ARC's p rounds alike
    handle = open_host(size * capacity, "arc", prefault=0)
    payload = bytes(size)
    prefix = 0
    for request in trace.requests:
        keys = [str(key).encode() for key in request.keys]
        for key in keys:
            if handle.get([key])[0] is None:
                break
            prefix += 1
        handle.put(keys, [payload] * len(keys), [])  # stored ones are uses, as in a replay
    point = replay(trace, "arc", capacity)
    assert point.prefix_hits == prefix and 0 < prefix < point.block_hits
    assert point.evictions == handle.stats()["evictions"]
