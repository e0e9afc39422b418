"""contrib/kvtier-redis: kept blocks (``kvtier_keep``), marked and counted on a real server.

A mark lives on the server, in the key space's ``kept`` hash, and the tenant's
kept bytes in its ``meta``, both set by one Lua script that checks the
retention budget: so the marks hold for every process and connection sharing
the pool.  Each test floods the pool (another tenant, another process, the
tenant's own quota) and reads the kept blocks back byte for byte while the
unkept ones are gone.  On a cluster, each shard holds a tenant to its part of
the budget, ``keep // shards``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from redis_server import RedisServer
from redis_tenants import block, fresh_url, open_tenant
from writer_process import put_in_another_process

from kvtier.testing.keep import KeepTests

NS_A = "a" * 32  # tenant a's namespace
NS_B = "b" * 32  # tenant b's
NS_C = "c" * 32  # tenant c's
DB = 8


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    return fresh_url(redis_server, DB)


def keys(name: str, count: int) -> list[bytes]:
    return [f"{name}{i}".encode() for i in range(count)]


# --- the conformance kit's keep group ----------------------------------------------


class TestRedisKeepKit(KeepTests):
    """The kit's ``keep`` group with a budget: a block kept through three capacities of
    other puts, byte for byte (without ``tenants`` every mark is refused, and the
    group's capacity check skips: tests/contrib/test_redis_backend.py)."""

    backend = "redis"

    @pytest.fixture
    def backend_options(self, redis_server: RedisServer) -> dict[str, Any]:
        return {"url": redis_server.url(DB + 1), "prefix": "kitkeep", "capacity": "4MiB",
                "max_block_size": "2MiB", "tenants": {"*": {"keep": "1MiB"}}}

    @pytest.fixture(autouse=True)
    def _fresh_database(self, redis_server: RedisServer) -> None:
        fresh_url(redis_server, DB + 1)

    def test_kept_bytes_and_refusals_are_figures(self) -> None:
        held, more = b"figures-held", b"figures-more"
        assert self.store.put([held, more], [block(1, 600 << 10), block(2, 600 << 10)]) == [
            True, True]
        assert self._keep([held, more], True) == [True, False]  # 1200 KiB > 1 MiB
        stats = self.store.stats()
        assert (stats["kept_bytes"], stats["kept_blocks"], stats["keep_refused"]) == (
            600 << 10, 1, 1)


# --- pressure from others ---------------------------------------------------------------


def test_kept_blocks_survive_another_process_and_another_tenant(url: str) -> None:
    # quotas of the whole pool each: shares of 2500 once both hold blocks
    rules = {"a": {"quota": 5000, "keep": 3000}, "b": {"quota": 5000}}
    options = {"capacity": 5000, "tenants": rules}
    a = open_tenant(url, "a", NS_A, **options)
    b = open_tenant(url, "b", NS_B, **options)
    mine = keys("k", 5)
    assert a.kvtier_put(mine, [block(i) for i in range(5)], []) == [True] * 5
    assert a.kvtier_keep(mine[:3], True) == [True] * 3
    assert a.kvtier_keep([mine[3], b"never-put"], True) == [False, None]  # beyond 3000
    # another process of tenant a floods its quota: only a's unkept blocks make room
    flood = keys("p", 10)
    put_in_another_process("redis", {"url": url, "tenant": "a", **options}, NS_A, flood,
                           [block(100 + i) for i in range(10)])
    assert a.kvtier_get(mine) == [block(0), block(1), block(2), None, None]
    assert a.kvtier_lookup(flood) == [False] * 8 + [True] * 2
    # tenant b, another connection, writes six times the pool: a, beyond its share,
    # gives up what it may, never a kept block
    for i in range(30):
        assert b.kvtier_put([f"n{i}".encode()], [block(200 + i)], []) == [True]
    assert a.kvtier_get(mine[:3]) == [block(0), block(1), block(2)]
    assert a.kvtier_lookup(flood) == [False] * 10
    stats = b.kvtier_stats()
    assert stats["tenant_bytes.a"] == 3000 and stats["tenant_bytes.b"] == 2000
    assert a.kvtier_stats()["kept_bytes"] == 3000 and stats["kept_blocks"] == 3
    assert stats["kept_bytes"] == 0  # b's own: it keeps nothing
    # released, they are a's oldest blocks again (never used since their put)
    assert a.kvtier_keep(mine[:3], False) == [True] * 3
    evicted: list[tuple[bytes, Any]] = []
    for i in range(3):
        assert a.kvtier_put([f"q{i}".encode()], [block(300 + i)], evicted) == [True]
    assert evicted == [(key, block(i)) for i, key in enumerate(mine[:3])]
    assert a.kvtier_stats()["kept_bytes"] == 0
    for backend in (a, b):
        backend.kvtier_close()


def test_a_victim_tenant_holding_only_kept_blocks_passes_the_eviction_on(url: str) -> None:
    # shares of 3000 each; a is 1000 beyond with kept blocks alone, b 1000 beyond too
    options = {"capacity": 9000, "tenants": {"*": {"keep": 4000}}}
    a = open_tenant(url, "a", NS_A, **options)
    b = open_tenant(url, "b", NS_B, **options)
    c = open_tenant(url, "c", NS_C, **options)
    assert a.kvtier_put(keys("a", 4), [block(i) for i in range(4)], []) == [True] * 4
    assert a.kvtier_keep(keys("a", 4), True) == [True] * 4
    assert b.kvtier_put(keys("b", 4), [block(10 + i) for i in range(4)], []) == [True] * 4
    assert c.kvtier_put([b"c0"], [block(20)], []) == [True]
    # a full pool: a is the victim (first by name of the two beyond their share), has
    # nothing but kept blocks, so b gives the room; c within its share loses nothing
    assert c.kvtier_put([b"c1"], [block(21)], []) == [True]
    assert a.kvtier_get(keys("a", 4)) == [block(i) for i in range(4)]
    assert b.kvtier_lookup(keys("b", 4)) == [False, True, True, True]
    assert c.kvtier_get([b"c0", b"c1"]) == [block(20), block(21)]
    stats = c.kvtier_stats()
    assert stats["tenant_evicted.b"] == 1 and stats.get("tenant_evicted.a", 0) == 0
    for backend in (a, b, c):
        backend.kvtier_close()


def test_a_put_only_kept_blocks_could_make_room_for_is_refused(url: str) -> None:
    options = {"capacity": 100_000, "tenants": {"a": {"quota": 3000, "keep": 3000}}}
    a = open_tenant(url, "a", NS_A, **options)
    assert a.kvtier_put(keys("k", 3), [block(i) for i in range(3)], []) == [True] * 3
    assert a.kvtier_keep(keys("k", 3), True) == [True] * 3
    evicted: list[tuple[bytes, Any]] = []
    assert a.kvtier_put([b"more"], [block(9)], evicted) == [False]
    assert evicted == [] and a.kvtier_get(keys("k", 3)) == [block(i) for i in range(3)]
    stats = a.kvtier_stats()
    assert stats["tenant_refused.a"] == 1 and stats["tenant_bytes.a"] == 3000
    # one released: it makes the room
    assert a.kvtier_keep([b"k0"], False) == [True]
    assert a.kvtier_put([b"more"], [block(9)], evicted) == [True]
    assert evicted == [(b"k0", block(0))]
    assert a.kvtier_get([b"k1", b"k2", b"more"]) == [block(1), block(2), block(9)]
    a.kvtier_close()


# --- the budget -------------------------------------------------------------------------


def test_the_budget_holds_for_every_connection_of_a_tenant(url: str) -> None:
    options = {"capacity": 100_000, "tenants": {"a": {"keep": 2500}, "*": {"keep": 0}}}
    one = open_tenant(url, "a", NS_A, **options)
    two = open_tenant(url, "a", NS_A, **options)  # a second connection
    other_ns = open_tenant(url, "a", "d" * 32, **options)  # a's other namespace
    b = open_tenant(url, "b", NS_B, **options)
    assert one.kvtier_put(keys("k", 4), [block(i) for i in range(4)], []) == [True] * 4
    assert other_ns.kvtier_put([b"d0"], [block(40)], []) == [True]
    assert b.kvtier_put([b"b0"], [block(50)], []) == [True]
    assert one.kvtier_keep([b"k0"], True) == [True]
    assert one.kvtier_keep([b"k0"], True) == [True]  # again: counted once
    assert other_ns.kvtier_keep([b"d0"], True) == [True]
    # 2000 of 2500 kept by a's namespaces together: the next mark is refused, whoever asks
    assert two.kvtier_keep([b"k1", b"k2"], True) == [False, False]
    assert b.kvtier_keep([b"b0"], True) == [False]  # b has no budget
    figures = two.kvtier_stats()
    assert (figures["kept_bytes"], figures["keep_refused"], figures["kept_blocks"]) == (
        2000, 2, 2)
    assert b.kvtier_stats()["keep_refused"] == 1
    # a release gives the budget back to the tenant
    assert one.kvtier_keep([b"k0"], False) == [True]
    assert two.kvtier_keep([b"k1", b"k2"], True) == [True, False]
    assert one.kvtier_stats()["kept_bytes"] == 2000
    for backend in (one, two, other_ns, b):
        backend.kvtier_close()


def test_a_pool_of_kept_blocks_refuses_puts_and_marks_stay_within_the_capacity(
    url: str,
) -> None:
    rules = {"*": {"keep": 3000}}
    a = open_tenant(url, "a", NS_A, capacity=4000, tenants=rules)
    b = open_tenant(url, "b", NS_B, capacity=4000, tenants=rules)
    assert a.kvtier_put(keys("a", 2), [block(i) for i in range(2)], []) == [True] * 2
    assert b.kvtier_put(keys("b", 2), [block(10 + i) for i in range(2)], []) == [True] * 2
    assert a.kvtier_keep(keys("a", 2), True) == [True, True]
    assert b.kvtier_keep(keys("b", 2), True) == [True, True]
    assert a.kvtier_put([b"a2"], [block(2)], []) == [False]  # a full pool, all kept
    assert a.kvtier_stats()["tenant_refused.a"] == 1
    # the capacity bounds all tenants' marks together: a process given a smaller one
    # (capacities are each process's own) refuses a mark beyond it
    small = open_tenant(url, "b", NS_B, capacity=3000, tenants=rules)
    assert b.kvtier_keep([b"b0"], False) == [True]
    assert small.kvtier_keep([b"b0"], True) == [False]  # 3000 kept + 1000 > 3000
    assert a.kvtier_put([b"a2"], [block(2)], []) == [True]  # b's released block went
    assert b.kvtier_get(keys("b", 2)) == [None, block(11)]
    assert a.kvtier_get(keys("a", 3)) == [block(0), block(1), block(2)]
    for backend in (a, b, small):
        backend.kvtier_close()


def test_without_tenants_every_mark_is_refused(url: str) -> None:
    a = open_tenant(url, "a", NS_A, capacity=10_000)
    assert a.kvtier_put([b"k"], [block(1)], []) == [True]
    assert a.kvtier_keep([b"k", b"absent"], True) == [False, None]
    assert a.kvtier_keep([b"k", b"absent"], False) == [True, None]
    stats = a.kvtier_stats()
    assert (stats["kept_bytes"], stats["kept_blocks"], stats["keep_refused"]) == (0, 0, 1)
    a.kvtier_close()


# --- what removes a mark ------------------------------------------------------------------


def test_expiry_wins_over_keep_and_an_evict_or_a_new_put_leaves_no_mark(url: str) -> None:
    options = {"capacity": 3000, "tenants": {"*": {"keep": 2000}}}
    short = open_tenant(url, "a", NS_A, expire="300ms", **options)
    assert short.kvtier_put([b"e"], [block(1)], []) == [True]
    assert short.kvtier_keep([b"e"], True) == [True]
    time.sleep(0.5)
    assert short.kvtier_get([b"e"]) == [None]
    assert short.kvtier_keep([b"e"], True) == [None]  # expired: not stored, not kept
    stats = short.kvtier_stats()
    assert (stats["kept_bytes"], stats["kept_blocks"], stats["tenant_expired.a"]) == (0, 0, 1)
    short.kvtier_close()
    a = open_tenant(url, "a", NS_B, **options)
    assert a.kvtier_put([b"k0", b"k1"], [block(2), block(3)], []) == [True, True]
    assert a.kvtier_keep([b"k0", b"k1"], True) == [True, True]
    assert a.kvtier_evict([b"k0"]) == [True]  # an explicit evict removes a kept block
    assert a.kvtier_stats()["kept_bytes"] == 1000
    # stored again, k0 is not kept: the capacity takes it as the oldest unkept block
    assert a.kvtier_put([b"k0"], [block(4)], []) == [True]
    assert a.kvtier_put([b"k2"], [block(5)], []) == [True]
    assert a.kvtier_put([b"k3"], [block(6)], []) == [True]
    assert a.kvtier_get([b"k0", b"k1", b"k2", b"k3"]) == [None, block(3), block(5), block(6)]
    a.kvtier_close()


def test_a_kept_block_keeps_its_recency_for_its_release(url: str) -> None:
    options = {"capacity": 3000, "tenants": {"*": {"keep": 1000}}}
    a = open_tenant(url, "a", NS_A, **options)
    assert a.kvtier_put(keys("k", 3), [block(i) for i in range(3)], []) == [True] * 3
    assert a.kvtier_keep([b"k0"], True) == [True]
    assert a.kvtier_get([b"k0"]) == [block(0)]  # a use while kept: k0 is the newest
    assert a.kvtier_keep([b"k0"], False) == [True]
    evicted: list[tuple[bytes, Any]] = []
    assert a.kvtier_put([b"k3"], [block(3)], evicted) == [True]
    assert evicted == [(b"k1", block(1))]  # the oldest is k1, not the released k0
    a.kvtier_close()


# --- a cluster: the budget per shard ----------------------------------------------------


def test_on_a_cluster_each_shard_holds_a_tenant_to_its_part_of_the_budget(
    redis_cluster: Any,
) -> None:
    from redis.cluster import RedisCluster

    options = {"cluster": True, "prefix": "tk", "shards": 4, "capacity": 16_000,
               "tenants": {"*": {"keep": 4000}}}
    a = open_tenant(redis_cluster.url, "a", NS_A, **options)
    b = open_tenant(redis_cluster.url, "b", NS_B, **options)
    raw = RedisCluster.from_url(redis_cluster.url)
    try:
        mine = keys("k", 16)
        assert a.kvtier_put(mine, [block(i, 500) for i in range(16)], []) == [True] * 16
        marked = a.kvtier_keep(mine, True)
        assert None not in marked and False in marked  # 8000 bytes asked, 4000 at most
        per_shard = [int(raw.hget(f"tk:{{pool:{s}}}:meta", "k:a") or 0) for s in range(4)]
        assert all(held <= 1000 for held in per_shard), per_shard  # 4000 // 4
        kept = [key for key, flag in zip(mine, marked) if flag]
        assert len(kept) * 500 == sum(per_shard) == a.kvtier_stats()["kept_bytes"]
        assert a.kvtier_stats()["keep_refused"] == 16 - len(kept)
        for i in range(100):  # a and b write three pools' worth each
            assert a.kvtier_put([f"f{i}".encode()], [block(100 + i, 500)], []) == [True]
            assert b.kvtier_put([f"n{i}".encode()], [block(200 + i, 500)], []) == [True]
        assert a.kvtier_get(kept) == [block(int(key[1:]), 500) for key in kept]
        unkept = [key for key, flag in zip(mine, marked) if not flag]
        assert a.kvtier_lookup(unkept) == [False] * len(unkept)
    finally:
        a.kvtier_close()
        b.kvtier_close()
        raw.close()
        redis_cluster.flush()
