"""The host tier's adaptive policy follows the candidate that hits most, and keeps every block."""

from __future__ import annotations

from typing import Any

from host_blocks import block, k, open_host

from kvtier.backends.eviction import Adaptive, new_policy
from kvtier.plan import generate, replay


def test_it_leaves_lru_on_scans_and_keeps_it_on_sessions() -> None:
    scan = generate("scan", 20000, seed=1)
    lru, arc = replay(scan, "lru", 40).prefix_ratio, replay(scan, "arc", 40).prefix_ratio
    adaptive = replay(scan, "adaptive", 40).prefix_ratio
    assert lru < 0.05 < 0.12 < adaptive <= arc + 0.005  # ARC keeps the hot set; so does it
    sessions = generate("sessions", 20000, seed=1)
    best = replay(sessions, "lru", 967).prefix_ratio  # LRU is best in hindsight here
    assert abs(replay(sessions, "adaptive", 967).prefix_ratio - best) < 0.005


def test_a_switch_hands_every_block_on_in_order() -> None:
    policy: Any = new_policy("adaptive", 64)
    assert isinstance(policy, Adaptive)
    for i in range(64):
        policy.admit(i, b"x", [])
    before = [key for key, _ in policy.sizes()]
    policy._scores = [0.0, 10.0, 0.0]  # arc ahead: the next decision switches to it
    policy._decide()
    assert policy.leader == 1 and policy.switches == 1
    assert sorted(key for key, _ in policy.sizes()) == sorted(before)
    assert policy.used == 64 and policy.holds(before) == [True] * 64
    evicted: list[Any] = []
    policy.admit(64, b"x", evicted)  # ARC's first victim is the oldest LRU block
    assert [key for key, _ in evicted] == [before[0]] and policy.evictions == 1


def test_a_switch_hands_on_which_blocks_were_used_again() -> None:
    policy: Any = new_policy("adaptive", 4)
    for key in range(4):
        policy.admit(key, b"x", [])
    assert policy.access(0) == b"x" and policy.access(1) == b"x"
    policy._scores = [0.0, 0.0, 10.0]  # s3fifo ahead
    policy._decide()
    assert policy.leader == 2
    evicted: list[Any] = []
    for key in (4, 5, 6):
        policy.admit(key, b"x", evicted)
    # 0 and 1 were used again: they reach S3-FIFO's main queue, and new block 4 leaves first
    assert [key for key, _ in evicted] == [2, 3, 4]
    assert policy.holds([0, 1, 5, 6]) == [True] * 4


def test_it_switches_on_hits_beyond_chance_where_the_policies_disagree() -> None:
    policy: Any = new_policy("adaptive", 64)
    policy.admit(0, b"x", [])
    # s3fifo hit 10 more than lru, but they disagreed on 110 uses: within chance (2 sd = 21)
    policy._scores = [100.0, 0.0, 110.0]
    policy._apart[2][0], policy._apart[0][2] = 60.0, 50.0
    policy._decide()
    assert (policy.leader, policy.switches) == (0, 0)
    # the same 10 hits where they disagreed on 10 uses only: beyond chance (2 sd = 6.3)
    policy._apart[2][0], policy._apart[0][2] = 10.0, 0.0
    policy._decide()
    assert (policy.leader, policy.switches) == (2, 1)


def test_it_follows_the_best_policy_on_long_documents() -> None:
    # a fixed 2% margin stayed with lru here, 1.0 point below s3fifo (92.9%)
    documents = generate("documents", 20000, seed=1)
    best = max(replay(documents, name, 2446).prefix_ratio for name in ("arc", "s3fifo"))
    assert replay(documents, "adaptive", 2446).prefix_ratio > best - 0.005


def test_the_tier_serves_the_same_bytes_across_switches() -> None:
    size = 1024
    handle = open_host(40 * size, "adaptive", prefault=0)
    hot = [k(f"hot-{i}") for i in range(8)]
    handle.put(hot, [block(key, size) for key in hot], [])
    filler = bytes(size)
    for burst in range(100):
        scan = [k(f"scan-{burst}-{i}") for i in range(48)]  # more than the tier holds
        handle.put(scan, [filler] * len(scan), [])
        for key, data in zip(hot, handle.get(hot), strict=True):
            if data is None:
                handle.put([key], [block(key, size)], [])
            else:
                assert data == block(key, size)
    stats = handle.stats()
    assert stats["adaptive_switches"] >= 1 and stats["adaptive_leader"] != 0
    assert stats["used_bytes"] <= 40 * size
    assert handle.get(hot) == [block(key, size) for key in hot]
