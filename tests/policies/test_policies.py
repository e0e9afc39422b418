"""Every registered eviction policy through one set of behavioural tests.

Each test is parametrized over :data:`kvtier.policies.NAMES`, so a policy
added to the registry is checked with no test written for it: the keys and
sizes it holds are always those a plain dict model says (admitted, minus the
keys it reported evicted or was told to remove), it never holds more than its
capacity after an admit or a shed, a lookup is not a use, and on random traces
of equal-sized blocks it never hits more than Belady's MIN, the offline
optimum of a cache that admits every miss (computed here by a simulator of
its own, not by ``kvtier plan``'s).  The same tests run two partitioned
tiers (:class:`kvtier.policies.Partitioned`): keys split in two partitions,
with and without a quota.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.policies import NAMES, POLICIES, Lru, Partitioned, Policy, new_policy, supported

KEYS = st.integers(0, 15).map(lambda i: b"k%d" % i)
SIZES = st.integers(0, 12)
OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), KEYS, SIZES),  # a tier's put: a use if held, else an admit
    st.tuples(st.just("access"), KEYS),
    st.tuples(st.just("remove"), KEYS),
    st.tuples(st.just("holds"), st.lists(KEYS, max_size=4)),
    st.tuples(st.just("enter"), KEYS, SIZES),
    st.tuples(st.just("resize"), KEYS, SIZES),
    st.tuples(st.just("shed")),
    st.tuples(st.just("make_room"), st.integers(0, 20)),
), max_size=120)


def by_parity(key: bytes) -> str:
    """Two partitions, by the key's last byte: ``b"k3"`` is in "odd"."""
    return "odd" if key[-1] % 2 else "even"


#: Every policy the tests run, by name: the registry's, and two partitioned tiers.
MAKERS: dict[str, Callable[[int], Policy]] = {
    **{name: (lambda capacity, name=name: new_policy(name, capacity)) for name in NAMES},
    "partitioned-lru": lambda capacity: Partitioned("lru", capacity, by_parity),
    "partitioned-s3fifo-quota": lambda capacity: Partitioned(
        "s3fifo", capacity, by_parity, quotas={"odd": max(1, capacity // 3)}),
}
ALL = sorted(MAKERS)


def limit(policy: Policy, key: bytes) -> int:
    """The largest block ``policy`` takes for ``key``: its capacity, or a partition's quota."""
    return policy.limit(key) if isinstance(policy, Partitioned) else policy.capacity


#: Bounded so the whole file runs in seconds on two cores.
FEW = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_against_model(policy: Policy, model: dict[bytes, int]) -> None:
    held = policy.held()
    assert dict(held) == model, "the policy holds other keys or sizes than it was given"
    assert len(held) == len(model) == len(policy)
    assert policy.used == sum(model.values())
    assert policy.holds(list(model)) == [True] * len(model)


def evicted(policy: Policy, model: dict[bytes, int], victims: list[bytes],
            before: int) -> None:
    """``victims`` were held, are no longer, and each counts one eviction."""
    assert len(set(victims)) == len(victims), "a key evicted twice"
    for key in victims:
        assert key in model, f"{key!r} evicted but never held"
        del model[key]
    assert policy.holds(victims) == [False] * len(victims)
    assert policy.evictions == before + len(victims)


@pytest.mark.parametrize("name", NAMES)
def test_the_registry_builds_each_policy_by_its_name(name: str) -> None:
    policy = new_policy(name, 100)
    assert policy.name == name and POLICIES[name] is type(policy)
    assert isinstance(policy, Policy)
    assert (policy.capacity, policy.used, policy.evictions, len(policy)) == (100, 0, 0, 0)
    assert all(isinstance(value, int) for value in policy.stats().values())


def test_a_backend_declares_only_registered_policies() -> None:
    assert supported("lru", "s3fifo") == ("lru", "s3fifo")
    with pytest.raises(ValueError, match="not eviction policies: lfu"):
        supported("lru", "lfu")


@pytest.mark.parametrize("name", ALL)
@FEW
@given(capacity=st.integers(1, 40), ops=OPS)
def test_it_holds_what_it_was_given_less_what_it_reported(
        name: str, capacity: int, ops: list[tuple[Any, ...]]) -> None:
    policy = MAKERS[name](capacity)
    model: dict[bytes, int] = {}
    for op, *args in ops:
        before = policy.evictions
        if op == "put":
            key, size = args
            if policy.access(key):
                assert key in model
            elif size <= limit(policy, key):
                victims = policy.admit(key, size)
                assert key not in victims
                evicted(policy, model, victims, before)
                model[key] = size
                assert policy.used <= capacity, "over the capacity after an admit"
        elif op == "access":
            (key,) = args
            assert policy.access(key) == (key in model)
        elif op == "remove":
            (key,) = args
            assert policy.remove(key) == (key in model)
            model.pop(key, None)
            assert policy.evictions == before, "a removal counted as an eviction"
        elif op == "holds":
            (keys,) = args
            assert policy.holds(keys) == [key in model for key in keys]
        elif op == "enter":
            key, size = args
            if key not in model:
                policy.enter(key, size)
                model[key] = size
                assert policy.evictions == before, "enter evicted"
        elif op == "resize":
            key, size = args
            if key in model:
                policy.resize(key, size)
                model[key] = size
        elif op == "shed":
            evicted(policy, model, policy.shed(), before)
            assert policy.used <= capacity, "over the capacity after a shed"
        else:
            (nbytes,) = args
            used = policy.used
            evicted(policy, model, policy.make_room(nbytes), before)
            assert policy.used <= max(0, used - nbytes)
        check_against_model(policy, model)


@pytest.mark.parametrize("name", ALL)
def test_a_lookup_is_not_a_use_and_an_access_is(name: str) -> None:
    # 10 blocks of 1 byte fill it; an access of the oldest keeps it past the next admits
    # under every policy (lru: the newest; arc: into T2; s3fifo: used again, to M); a
    # lookup of it does not.  The keys end in "0": one partition, the one with no quota
    for use in (True, False):
        policy = MAKERS[name](10)
        for i in range(10):
            policy.admit(b"k%d0" % i, 1)
        if use:
            assert policy.access(b"k00")
        else:
            assert policy.holds([b"k00"]) == [True]
            assert policy.size(b"k00") == 1
        gone = [key for i in range(10, 13) for key in policy.admit(b"k%d0" % i, 1)]
        assert (b"k00" in gone) != use, (use, gone)


@pytest.mark.parametrize("name", ALL)
def test_remove_forgets_a_key_and_returns_whether_it_was_held(name: str) -> None:
    policy = MAKERS[name](100)
    assert policy.admit(b"a", 30) == [] and policy.admit(b"b", 20) == []
    assert policy.remove(b"a") and not policy.remove(b"a") and not policy.remove(b"zz")
    assert (policy.used, len(policy), policy.evictions) == (20, 1, 0)
    assert policy.holds([b"a", b"b"]) == [False, True] and not policy.access(b"a")
    assert policy.size(b"a") is None and policy.size(b"b") == 20


@pytest.mark.parametrize("name", ALL)
def test_enter_makes_no_room_until_a_shed(name: str) -> None:
    policy = MAKERS[name](10)
    for i in range(15):
        policy.enter(b"k%d" % i, 1)
    assert (policy.used, policy.evictions) == (15, 0)
    gone = policy.shed()
    assert len(gone) == 5 and policy.used == 10 and policy.evictions == 5
    assert policy.holds(gone) == [False] * 5


def test_a_partition_evicts_its_own_blocks_to_keep_its_quota() -> None:
    policy = Partitioned("lru", 100, by_parity, quotas={"odd": 20})
    for key in (b"k0", b"k2", b"k4", b"k6", b"k8", b"k1", b"k3"):
        assert policy.admit(key, 10) == []
    assert policy.admit(b"k5", 10) == [b"k1"]  # odd's quota: its oldest, not an even one
    assert (policy.used_by("odd"), policy.used_by("even"), policy.limit(b"k7")) == (20, 50, 20)
    for key in (b"k10", b"k12", b"k14"):
        assert policy.admit(key, 10) == []
    # the capacity: from the partition most beyond its share (even: 80 of 50)
    assert policy.admit(b"k16", 10) == [b"k0"]
    assert policy.stats() == {"partition_used_even": 80, "partition_used_odd": 20}
    assert policy.evictions == 2 and policy.used == 100
    with pytest.raises(ValueError, match="over its partition's quota"):
        policy.admit(b"k9", 30)


def belady_hits(trace: list[int], capacity: int) -> int:
    """Hits of Belady's MIN with ``capacity`` equal blocks: every miss is admitted, and a
    full cache evicts the block whose next reference is farthest (or never comes)."""
    never = len(trace)
    next_ref = [never] * len(trace)
    seen: dict[int, int] = {}
    for i in range(len(trace) - 1, -1, -1):
        next_ref[i] = seen.get(trace[i], never)
        seen[trace[i]] = i
    cache: dict[int, int] = {}  # key -> its next reference
    hits = 0
    for i, key in enumerate(trace):
        if key in cache:
            hits += 1
        elif len(cache) >= capacity:
            del cache[max(cache, key=cache.__getitem__)]
        cache[key] = next_ref[i]
    return hits


def policy_hits(policy: Policy, trace: list[int]) -> int:
    """Hits of ``policy`` on ``trace`` (a miss is admitted), checking its keys as it goes."""
    hits = 0
    model: dict[bytes, int] = {}
    for key in trace:
        block = key.to_bytes(2, "little")
        if policy.access(block):
            assert block in model
            hits += 1
        else:
            before = policy.evictions
            evicted(policy, model, policy.admit(block, 1), before)
            model[block] = 1
            assert policy.used <= policy.capacity
        assert len(policy) == len(model)
    check_against_model(policy, model)
    return hits


def test_the_bound_is_belady_s() -> None:
    # 1 2 3 1 2 3 in 2 blocks: MIN keeps 1 then 3 (2 hits); LRU hits nothing
    assert belady_hits([1, 2, 3, 1, 2, 3], 2) == 2
    assert policy_hits(Lru(2), [1, 2, 3, 1, 2, 3]) == 0
    assert belady_hits([5, 5, 5], 1) == 2 and belady_hits([1, 2, 1], 1) == 0
    # tight enough to catch a policy that keeps one block more than its capacity
    trace = [i % 4 for i in range(40)]
    assert policy_hits(Lru(4), trace) > belady_hits(trace, 3)


TRACES = st.lists(st.integers(0, 11), min_size=1, max_size=300)


@pytest.mark.parametrize("name", ALL)
@FEW
@given(capacity=st.integers(1, 8), trace=TRACES)
def test_no_policy_hits_more_than_belady_s_min(name: str, capacity: int,
                                               trace: list[int]) -> None:
    assert policy_hits(MAKERS[name](capacity), trace) <= belady_hits(trace, capacity)


@pytest.mark.parametrize("name", ALL)
@FEW
@given(capacity=st.integers(1, 8),
       trace=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30)), max_size=200))
def test_none_beats_min_on_skewed_traces_either(name: str, capacity: int,
                                                trace: list[tuple[int, int]]) -> None:
    # a hot set of 4 keys between one-off ones: the traffic ARC and S3-FIFO are built for
    keys = [hot if roll % 3 else 100 + i for i, (hot, roll) in enumerate(trace)]
    assert policy_hits(MAKERS[name](capacity), keys) <= belady_hits(keys, capacity)
