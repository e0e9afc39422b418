"""Tenants in the host tier: one capacity shared by group, quotas, weights, refusals, expiry.

Each instance is a real host backend opened through the registry; two
instances that name one ``share`` group are two tenants' tiers of one
process.  Every claim is read back: the bytes a get returns, and the
per-tenant figures of ``stats()``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import pytest
from host_blocks import block, k, open_host

from kvtier.plugins.registry import BackendHandle
from kvtier.spec import BytesLike, ConfigError

NS_A = "a" * 32
NS_B = "b" * 32
_groups = itertools.count()

Opener = Callable[..., BackendHandle]


@pytest.fixture
def tenant_host() -> Iterator[Opener]:
    """Opens host instances of tenants in one group of this test's (as open_tenants names
    one), and closes the ones still open after it."""
    group, opened = f"test-{next(_groups)}", []

    def open_one(ns: str, tenant: str, capacity: int, **extra: object) -> BackendHandle:
        handle = open_host(capacity, ns=ns, tenant=tenant, share=group, **extra)
        opened.append(handle)
        return handle

    yield open_one
    for handle in opened:
        handle.close()


def put_each(handle: BackendHandle, keys: list[bytes], size: int) -> list[bool]:
    """One put per key, as a chain writes a prompt's blocks one after another."""
    return [handle.put([key], [block(key, size)], [])[0] for key in keys]


def held(handle: BackendHandle, keys: list[bytes], size: int) -> list[bytes]:
    """The keys whose get returns their exact bytes; a wrong byte fails the test."""
    out = []
    for key, data in zip(keys, handle.get(keys), strict=True):
        if data is not None:
            assert bytes(data) == block(key, size), key
            out.append(key)
    return out


def test_one_group_shares_one_capacity_and_a_quota_evicts_its_own(tenant_host: Opener) -> None:
    quiet = tenant_host(NS_A, "quiet", 1000, tenants={"noisy": {"quota": 300}})
    noisy = tenant_host(NS_B, "noisy", 1000, tenants={"noisy": {"quota": 300}})
    quiet_keys, noisy_keys = [k(f"q{i}") for i in range(6)], [k(f"n{i}") for i in range(40)]
    assert put_each(quiet, quiet_keys, 100) == [True] * 6
    evicted: list[tuple[bytes, BytesLike]] = []
    for key in noisy_keys:
        assert noisy.put([key], [block(key, 100)], evicted) == [True]
    # the noisy tenant's own oldest, handed back to its own caller; the quiet one keeps all
    assert [key for key, _ in evicted] == noisy_keys[:37]
    assert held(quiet, quiet_keys, 100) == quiet_keys
    assert held(noisy, noisy_keys, 100) == noisy_keys[37:]
    stats_q, stats_n = dict(quiet.stats()), dict(noisy.stats())
    assert stats_q["used_bytes"] == stats_n["used_bytes"] == 900  # one store, both see it
    assert (stats_q["tenant_bytes.quiet"], stats_n["tenant_bytes.noisy"]) == (600, 300)
    assert (stats_q["tenant_evicted.quiet"], stats_n["tenant_evicted.noisy"]) == (0, 37)
    quiet.close(), noisy.close()


def test_a_noisy_tenant_cannot_push_a_quiet_one_below_its_share(tenant_host: Opener) -> None:
    quiet, noisy = tenant_host(NS_A, "quiet", 1000), tenant_host(NS_B, "noisy", 1000)
    quiet_keys, noisy_keys = [k(f"q{i}") for i in range(4)], [k(f"n{i}") for i in range(100)]
    assert put_each(quiet, quiet_keys, 100) == [True] * 4  # 400 of a 500-byte share
    assert put_each(noisy, noisy_keys, 100) == [True] * 100  # ten times its share
    assert held(quiet, quiet_keys, 100) == quiet_keys
    # the rest of the one capacity is the noisy tenant's: 6 blocks, not a capacity of its own
    assert held(noisy, noisy_keys, 100) == noisy_keys[-6:]
    assert dict(noisy.stats())["used_bytes"] == 1000
    assert dict(quiet.stats())["tenant_evicted.quiet"] == 0
    quiet.close(), noisy.close()


def test_weights_split_the_capacity_between_two_writers(tenant_host: Opener) -> None:
    rules = {"heavy": {"weight": 3}, "light": {"weight": 1}}
    heavy = tenant_host(NS_A, "heavy", 1200, tenants=rules)
    light = tenant_host(NS_B, "light", 1200, tenants=rules)
    for i in range(60):  # both write far beyond their shares (900 and 300 bytes)
        heavy.put([k(f"h{i}")], [block(k(f"h{i}"), 100)], [])
        light.put([k(f"l{i}")], [block(k(f"l{i}"), 100)], [])
    assert held(heavy, [k(f"h{i}") for i in range(60)], 100) == [k(f"h{i}") for i in range(51, 60)]
    assert held(light, [k(f"l{i}") for i in range(60)], 100) == [k(f"l{i}") for i in range(57, 60)]
    assert dict(heavy.stats())["tenant_bytes.heavy"] == 900
    assert dict(light.stats())["tenant_bytes.light"] == 300
    heavy.close(), light.close()


def test_refusals_are_counted_per_tenant(tenant_host: Opener) -> None:
    a = tenant_host(NS_A, "a", 100, tenants={"b": {"quota": 40}})
    b = tenant_host(NS_B, "b", 100, tenants={"b": {"quota": 40}})
    # over its quota: refused, and counted
    assert b.put([k(1)], [block(k(1), 50)], []) == [False]
    # a's share is the 60 bytes b's quota leaves; a beyond it evicts itself, not b
    assert put_each(b, [k(2)], 40) == [True]
    assert put_each(a, [k(3), k(4)], 30) == [True, True]
    assert put_each(a, [k(5)], 30) == [True]
    assert held(b, [k(2)], 40) == [k(2)] and held(a, [k(3), k(4), k(5)], 30) == [k(4), k(5)]
    stats_a, stats_b = dict(a.stats()), dict(b.stats())
    assert (stats_b["tenant_refused.b"], stats_a["tenant_refused.a"]) == (1, 0)
    assert b.get([k(1)]) == [None]
    a.close(), b.close()


def test_a_put_that_would_take_a_block_within_its_share_is_refused(tenant_host: Opener) -> None:
    a, b = tenant_host(NS_A, "a", 100), tenant_host(NS_B, "b", 100)
    assert put_each(a, [k(1)], 50) == [True]  # a within its half
    assert put_each(b, [k(2)], 40) == [True]
    assert put_each(b, [k(3)], 60) == [False]  # b's own 40 gone, and still no room
    assert held(a, [k(1)], 50) == [k(1)]
    assert dict(b.stats())["tenant_refused.b"] == 1
    a.close(), b.close()


def test_victims_of_another_tenant_reach_its_own_next_put(tenant_host: Opener) -> None:
    a, b = tenant_host(NS_A, "a", 300), tenant_host(NS_B, "b", 300)
    assert put_each(a, [k(1), k(2), k(3)], 100) == [True] * 3  # the whole capacity
    assert put_each(b, [k(4)], 100) == [True]  # a is beyond its share: it gives up k(1)
    assert a.lookup([k(1)]) == [False]
    assert held(a, [k(1)], 100) == [k(1)]  # readable until a's next put hands it over
    handed: list[tuple[bytes, BytesLike]] = []
    a.put([k(9)], [block(k(9), 10)], handed)
    # then its own victim for this put, k(2): a is still the tenant beyond its share
    assert [(key, bytes(data)) for key, data in handed] == [(k(1), block(k(1), 100)),
                                                            (k(2), block(k(2), 100))]
    assert a.get([k(1)]) == [None]
    a.close(), b.close()


def test_a_group_refuses_other_settings_and_ends_with_its_last(tenant_host: Opener) -> None:
    a = tenant_host(NS_A, "a", 1000)
    with pytest.raises(ConfigError, match="must agree"):
        tenant_host(NS_B, "b", 2000)
    b = tenant_host(NS_B, "b", 1000)
    a.put([k(1)], [block(k(1), 100)], [])
    a.close()  # its namespace's blocks leave with it; the store stays for b
    assert dict(b.stats())["used_bytes"] == 0
    b.close()
    c = tenant_host(NS_A, "a", 2000)  # a fresh store: the group was released
    assert c.get([k(1)]) == [None] and dict(c.stats())["capacity_bytes"] == 2000
    c.close()


# expiry --------------------------------------------------------------------------
def test_blocks_expire_after_their_write() -> None:
    host = open_host(10_000, expire="500ms")
    keys = [k(i) for i in range(4)]
    put_each(host, keys, 100)
    assert held(host, keys, 100) == keys  # unexpired: exact bytes
    time.sleep(0.7)
    assert host.get(keys) == [None] * 4 and host.lookup(keys) == [False] * 4
    stats = dict(host.stats())
    assert (stats["expired"], stats["tenant_expired.default"], stats["used_bytes"]) == (4, 4, 0)
    host.close()


def test_a_put_sweeps_expired_blocks_without_a_get() -> None:
    host = open_host(10_000, expire={"after": "500ms"})
    put_each(host, [k(1), k(2)], 100)
    time.sleep(0.7)
    put_each(host, [k(3)], 100)
    stats = dict(host.stats())
    assert (stats["used_bytes"], stats["expired"], stats["blocks"]) == (100, 2, 1)
    assert held(host, [k(1), k(2), k(3)], 100) == [k(3)]
    host.close()


def test_blocks_expire_unused() -> None:
    host = open_host(10_000, expire={"unused": "1s"})
    put_each(host, [k(1), k(2)], 100)
    time.sleep(0.6)
    assert held(host, [k(1)], 100) == [k(1)]  # a use
    time.sleep(0.6)
    # k(2) unused for 1.2s: gone; k(1) used 0.6s ago: exact bytes
    assert held(host, [k(1), k(2)], 100) == [k(1)]
    assert dict(host.stats())["expired"] == 1
    host.close()


def test_expiry_in_a_shared_store_counts_the_tenant(tenant_host: Opener) -> None:
    a = tenant_host(NS_A, "a", 1000, expire="500ms")
    b = tenant_host(NS_B, "b", 1000, expire="500ms")
    put_each(a, [k(1)], 100)
    time.sleep(0.7)
    put_each(b, [k(2)], 100)  # b's put sweeps a's expired block
    assert dict(a.stats())["tenant_expired.a"] == 1
    assert dict(b.stats())["tenant_expired.b"] == 0
    assert held(b, [k(2)], 100) == [k(2)]
    a.close(), b.close()
