"""contrib/kvtier-redis: tenants' quotas, fair share and expiry, counted on a real ``redis-server``.

With ``tenants`` the tier's capacity is the pool of every namespace under the
prefix, and each tenant's bytes are counted on the server, in the put script.
The Lua that picks the victim of a full pool is checked against
:meth:`TenantRules.victim` on the server itself, case by case; the rest runs
through the backend as a chain opens it: one instance per tenant's namespace,
with the ``tenant`` option the chain passes.  Blocks are compared byte for byte.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kvtier_redis import _scripts
from redis_server import RedisServer
from redis_tenants import block, fresh_url, open_tenant
from writer_process import put_in_another_process

from kvtier.policies.tenancy import TenantRule, TenantRules, parse_tenants
from kvtier.spec import ConfigError
from kvtier.testing import BackendTests

NS_A = "a" * 32  # tenant a's namespace
NS_B = "b" * 32  # tenant b's namespace
DB = 6


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    return fresh_url(redis_server, DB)


# --- the conformance kit on a pool ----------------------------------------------------


class TestRedisKitPool(BackendTests):
    """With ``tenants`` (a pool of the namespaces under the prefix) and ``expire``: the kit's
    groups, capacity and corruption included, but for recency, which needs LRU over the
    one namespace (the pool's order is each tenant's, across its namespaces)."""

    backend = "redis"

    @pytest.fixture
    def backend_options(self, redis_server: RedisServer) -> dict[str, Any]:
        return {"url": redis_server.url(DB + 1), "prefix": "kitpool", "capacity": "4MiB",
                "max_block_size": "2MiB", "tenants": {"*": {"weight": 1}}, "expire": "1h"}

    @pytest.fixture(autouse=True)
    def _fresh_database(self, redis_server: RedisServer) -> None:
        # the pool spans namespaces: each test starts with it empty
        fresh_url(redis_server, DB + 1)

    def test_declares_the_pool(self) -> None:
        assert self.caps.capacity_scope == "pool" and self.caps.capacity == 4 << 20

    def test_each_namespace_counts_its_own_bytes(self) -> None:
        """Replaces the kit's check: a pool's used_bytes is the pool's (capacity_scope
        pool), so another namespace's instance sees the put too; its tenant's bytes are
        counted apart."""
        other = self.open_backend("f" * 32)
        before = other.stats()["used_bytes"]
        blocks = [random.Random(i).randbytes(2000) for i in range(4)]
        assert self.store.put([b"own-%d" % i for i in range(4)], blocks) == [True] * 4
        after = other.stats()
        assert after["used_bytes"] == before + 8000 == self.store.stats()["used_bytes"]
        assert after["tenant_bytes.default"] == after["used_bytes"]


# --- the Lua victim is TenantRules.victim ------------------------------------------

_HARNESS_HEAD = r"""
local rules = nil
if ARGV[1] ~= '' then rules = cjson.decode(ARGV[1]) end
local capacity, writer, size = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local held = {}
for t, n in pairs(cjson.decode(ARGV[5])) do held[t] = n end
"""


def _cases() -> Iterator[tuple[TenantRules, dict[str, int], int, str, int]]:
    # the module's own cases (tests/policies/test_tenancy.py), then random ones
    equal = TenantRules()
    yield equal, {"noisy": 90, "quiet": 10}, 100, "noisy", 10
    yield equal, {"noisy": 90, "quiet": 10}, 100, "quiet", 10
    yield equal, {"noisy": 55, "quiet": 45}, 100, "quiet", 5
    yield equal, {"a": 50, "b": 50}, 100, "a", 0
    yield equal, {"a": 50, "b": 50}, 100, "c", 0  # a tie of others: the first by name
    quotas = TenantRules({"a": TenantRule(quota=40), "b": TenantRule(quota=60)})
    yield quotas, {"a": 40, "b": 60}, 100, "b", 10
    yield quotas, {"a": 40, "b": 60}, 100, "a", 10
    rng = random.Random(39)
    names = ["A", "a", "acme", "b", "globex", "x-1", "z", "default"]
    for _ in range(400):
        named = {}
        for tenant in rng.sample([*names, "*"], rng.randint(0, 4)):
            quota = rng.choice([None, rng.randint(1, 5000)])
            named[tenant] = TenantRule(quota=quota, weight=float(rng.randint(1, 4)))
        held = {t: rng.choice([0, rng.randint(1, 4000)]) for t in rng.sample(names, 4)}
        yield (TenantRules(named), held, rng.randint(1, 8000), rng.choice(names),
               rng.randint(0, 2000))


def test_the_lua_victim_agrees_with_tenant_rules(redis_server: RedisServer) -> None:
    # the very text of the put script's victim, run on the server
    harness = _HARNESS_HEAD + _scripts._VICTIM + "\nreturn victim(size)\n"
    with redis.Redis.from_url(redis_server.url(DB)) as client:
        cases = list(_cases())
        for rules, held, capacity, writer, size in cases:
            want = rules.victim(held, capacity, writer, size)
            got = client.eval(harness, 0, rules.canonical() if rules else "", capacity,
                              writer, size, json.dumps(held))
            assert got.decode() == want, (rules, held, capacity, writer, size)
    assert len({victim for *_, victim in cases}) > 1


# --- quotas and fair share ----------------------------------------------------------


def test_a_tenant_beyond_its_quota_loses_only_its_own_blocks(url: str) -> None:
    rules = {"a": "3000", "b": "3000"}
    a = open_tenant(url, "a", NS_A, capacity=10_000, tenants=rules)
    b = open_tenant(url, "b", NS_B, capacity=10_000, tenants=rules)
    b_keys = [b"k0", b"k1"]
    b_blocks = [block(100), block(101)]
    assert b.kvtier_put(b_keys, b_blocks, []) == [True, True]
    # the same keys in a's namespace, then four more: a's quota holds three blocks
    a_keys = [f"k{i}".encode() for i in range(6)]
    a_blocks = [block(i) for i in range(6)]
    evicted: list[tuple[bytes, Any]] = []
    for key, data in zip(a_keys, a_blocks):
        assert a.kvtier_put([key], [data], evicted) == [True]
    # a's own oldest went, in LRU order, and were handed over to a
    assert evicted == list(zip(a_keys[:3], a_blocks[:3]))
    assert a.kvtier_get(a_keys) == [None] * 3 + a_blocks[3:]
    assert b.kvtier_get(b_keys) == b_blocks  # byte for byte
    stats = a.kvtier_stats()
    assert stats["tenant_bytes.a"] == 3000 and stats["tenant_evicted.a"] == 3
    assert stats["tenant_bytes.b"] == 2000 and stats.get("tenant_evicted.b", 0) == 0
    assert stats["used_bytes"] == 5000 and stats["blocks"] == 5
    assert b.kvtier_stats() == stats  # one pool, one count
    for backend in (a, b):
        backend.kvtier_close()


def test_a_full_pool_evicts_the_tenant_most_beyond_its_share(url: str) -> None:
    # no quotas, equal weights: 2000 bytes each while both hold blocks
    noisy = open_tenant(url, "noisy", NS_A, capacity=4000, tenants={"*": {"weight": 1}})
    quiet = open_tenant(url, "quiet", NS_B, capacity=4000, tenants={"*": {"weight": 1}})
    assert quiet.kvtier_put([b"q0"], [block(200)], []) == [True]
    noisy_keys = [f"n{i}".encode() for i in range(10)]
    for i, key in enumerate(noisy_keys):
        assert noisy.kvtier_put([key], [block(300 + i)], []) == [True]
    # ten times its share and more: the quiet tenant's block stayed
    assert quiet.kvtier_get([b"q0"]) == [block(200)]
    # the quiet tenant writes within its share: the noisy one gives up its oldest
    evicted: list[tuple[bytes, Any]] = []
    assert quiet.kvtier_put([b"q1"], [block(201)], evicted) == [True]
    assert evicted == []  # the victim was the other namespace's: deleted, not reported
    assert quiet.kvtier_get([b"q0", b"q1"]) == [block(200), block(201)]
    assert noisy.kvtier_lookup(noisy_keys) == [False] * 8 + [True] * 2
    stats = quiet.kvtier_stats()
    assert stats["tenant_bytes.noisy"] == 2000 and stats["tenant_bytes.quiet"] == 2000
    assert stats["tenant_evicted.noisy"] == 8
    for backend in (noisy, quiet):
        backend.kvtier_close()


def test_two_processes_quotas_are_counted_together(url: str) -> None:
    options = {"url": url, "tenant": "a", "capacity": 100_000, "tenants": {"a": 3000}}
    other = [block(400), block(401)]
    put_in_another_process("redis", options, NS_A, [b"p0", b"p1"], other)
    mine = open_tenant(url, "a", NS_A, capacity=100_000, tenants={"a": 3000})
    evicted: list[tuple[bytes, Any]] = []
    assert mine.kvtier_put([b"m0", b"m1"], [block(402), block(403)], evicted) == [True, True]
    # the other process's older block made room: 3000 bytes in all, not 3000 each
    assert evicted == [(b"p0", other[0])]
    assert mine.kvtier_get([b"p0", b"p1", b"m0", b"m1"]) == [None, other[1], block(402),
                                                              block(403)]
    assert mine.kvtier_stats()["tenant_bytes.a"] == 3000
    mine.kvtier_close()


def test_refusals_are_counted_per_tenant(url: str) -> None:
    a = open_tenant(url, "a", NS_A, capacity=10_000, max_block_size=5000,
                    tenants={"a": 2000})
    assert a.kvtier_put([b"small"], [block(500)], []) == [True]
    # over the quota, and over the size limit: refused, and nothing evicted for them
    evicted: list[tuple[bytes, Any]] = []
    assert a.kvtier_put([b"big", b"huge"], [block(501, 2001), block(502, 6000)],
                        evicted) == [False, False]
    assert evicted == [] and a.kvtier_get([b"small", b"big", b"huge"]) == [block(500), None,
                                                                            None]
    stats = a.kvtier_stats()
    assert stats["tenant_refused.a"] == 2 and stats["tenant_bytes.a"] == 1000
    a.kvtier_close()


def test_processes_with_other_rules_are_refused_naming_both(url: str) -> None:
    first = open_tenant(url, "a", NS_A, capacity=10_000, tenants={"a": "1KiB"})
    with pytest.raises(ConfigError, match=r'"a":\[1024,.*"a":\[2048,') as raised:
        open_tenant(url, "b", NS_B, capacity=10_000, tenants={"a": "2KiB"})
    assert raised.value.key == "tenants"
    # the same rules, written another way, are the same rules
    same = open_tenant(url, "b", NS_B, capacity=10_000, tenants={"a": {"quota": 1024}})
    for backend in (first, same):
        backend.kvtier_close()


# --- expiry ----------------------------------------------------------------------------


@pytest.mark.parametrize("tenants", [None, {"*": "1MiB"}], ids=["namespace", "pool"])
def test_blocks_expire_after_their_write_and_the_counts_follow(
    url: str, redis_server: RedisServer, tenants: Any
) -> None:
    a = open_tenant(url, "a", NS_A, capacity=100_000, tenants=tenants, expire="300ms")
    assert a.kvtier_put([b"k"], [block(1)], []) == [True]
    with redis.Redis.from_url(url) as client:
        assert 0 < client.pttl(f"kvtier:{NS_A}:b:k") <= 300
    assert a.kvtier_get([b"k"]) == [block(1)]
    time.sleep(0.5)
    assert a.kvtier_get([b"k"]) == [None]
    stats = a.kvtier_stats()
    assert stats["used_bytes"] == 0 and stats["blocks"] == 0
    assert stats["tenant_bytes.a"] == 0 and stats["tenant_expired.a"] == 1
    # the room is there again: a full capacity fits
    assert a.kvtier_put([b"full"], [block(2, 100_000)], []) == [True]
    a.kvtier_close()


def test_unused_blocks_expire_and_each_get_pushes_it_back_up_to_after(url: str) -> None:
    a = open_tenant(url, "a", NS_A, tenants={"*": {"weight": 1}},
                    expire={"unused": "400ms", "after": "1s"})
    assert a.kvtier_put([b"read", b"idle"], [block(1), block(2)], []) == [True, True]
    for _ in range(3):  # 750 ms in all, never 400 ms unused
        time.sleep(0.25)
        assert a.kvtier_get([b"read"]) == [block(1)]
    assert a.kvtier_get([b"idle"]) == [None]
    time.sleep(0.4)  # past `after` (1 s from the write), however recently read
    assert a.kvtier_get([b"read"]) == [None]
    stats = a.kvtier_stats()
    assert stats["tenant_expired.a"] == 2 and stats["tenant_bytes.a"] == 0
    a.kvtier_close()


def test_rules_parse_as_kvtier_declares_them(url: str) -> None:
    with pytest.raises(ConfigError) as raised:
        open_tenant(url, "a", NS_A, tenants={"a": {"qouta": 1}})
    assert raised.value.key == "tenants" and "unknown key 'qouta'" in str(raised.value)
    with pytest.raises(ConfigError) as raised:
        open_tenant(url, "a", NS_A, expire="0s")
    assert raised.value.key == "expire"
    assert parse_tenants({"a": 1}).canonical() == '{"a":[1,1.0,0]}'


# --- a cluster: the quota per shard ----------------------------------------------------


def test_on_a_cluster_each_shard_holds_a_tenant_to_its_part_of_the_quota(
    redis_cluster: Any,
) -> None:
    from redis.cluster import RedisCluster

    options = {"cluster": True, "prefix": "tq", "shards": 4,
               "capacity": "1MiB", "tenants": {"a": 8000, "b": 8000}}
    a = open_tenant(redis_cluster.url, "a", NS_A, **options)
    b = open_tenant(redis_cluster.url, "b", NS_B, **options)
    raw = RedisCluster.from_url(redis_cluster.url)
    try:
        b_keys = [f"b{i}".encode() for i in range(4)]
        assert b.kvtier_put(b_keys, [block(i, 500) for i in range(4)], []) == [True] * 4
        for i in range(40):  # 20,000 bytes: two and a half times a's quota
            assert a.kvtier_put([f"a{i}".encode()], [block(100 + i, 500)], []) == [True]
        per_shard = [int(raw.hget(f"tq:{{pool:{s}}}:meta", "b:a") or 0) for s in range(4)]
        assert all(0 < held <= 2000 for held in per_shard), per_shard  # 8000 // 4
        stats = a.kvtier_stats()
        assert stats["tenant_bytes.a"] == sum(per_shard) <= 8000
        assert stats["tenant_evicted.a"] == 40 - sum(per_shard) // 500
        assert stats["tenant_bytes.b"] == 2000 and stats.get("tenant_evicted.b", 0) == 0
        assert b.kvtier_get(b_keys) == [block(i, 500) for i in range(4)]
        # a block larger than a's part of the quota in a shard is refused, and counted
        assert a.kvtier_put([b"big"], [block(9, 2001)], []) == [False]
        assert a.kvtier_stats()["tenant_refused.a"] == 1
    finally:
        a.kvtier_close()
        b.kvtier_close()
        raw.close()
        redis_cluster.flush()


def test_on_a_cluster_other_rules_are_refused_and_expired_blocks_counted_off(
    redis_cluster: Any,
) -> None:
    options = {"cluster": True, "prefix": "tx", "shards": 3, "capacity": "1MiB",
               "tenants": {"*": "30000"}, "expire": "300ms"}
    a = open_tenant(redis_cluster.url, "a", NS_A, **options)
    try:
        with pytest.raises(ConfigError, match=r'"\*":\[30000,.*"\*":\[40000,') as raised:
            open_tenant(redis_cluster.url, "b", NS_B, **{**options, "tenants": {"*": "40000"}})
        assert raised.value.key == "tenants"
        keys = [f"e{i}".encode() for i in range(12)]
        assert a.kvtier_put(keys, [block(i, 500) for i in range(12)], []) == [True] * 12
        assert a.kvtier_stats()["tenant_bytes.a"] == 6000
        time.sleep(0.5)
        assert a.kvtier_get(keys) == [None] * 12
        stats = a.kvtier_stats()  # every shard swept
        assert stats["tenant_bytes.a"] == 0 and stats["used_bytes"] == 0
        assert stats["tenant_expired.a"] == 12 and stats["blocks"] == 0
    finally:
        a.kvtier_close()
        redis_cluster.flush()


# --- through the chain ----------------------------------------------------------------


def test_a_chain_per_tenant_keeps_each_to_its_quota(url: str, tmp_path: Any) -> None:
    from kvtier.chain.tenants import open_tenants

    config = tmp_path / "chain.yaml"
    config.write_text(
        "version: 1\n"
        "chain:\n"
        "  - name: redis\n"
        "    backend: redis\n"
        f"    url: {url}\n"
        "    capacity: 1MiB\n"
        "    tenants:\n"
        "      '*': {quota: 200KiB}\n"
    )
    quiet_keys = [f"q{i}".encode() for i in range(4)]
    quiet_blocks = [block(i, 16 * 1024) for i in range(4)]
    with open_tenants(config, {"model": "tiny-llama", "dtype": "bfloat16"}) as tenants:
        assert tenants.chain("quiet").put(quiet_keys, quiet_blocks) == [True] * 4
        noisy = tenants.chain("noisy")
        for i in range(40):  # 640 KiB: more than three times its quota
            assert noisy.put([f"n{i}".encode()], [block(100 + i, 16 * 1024)]) == [True]
        assert noisy.flush(timeout=30)
        assert tenants.chain("quiet").get_bytes(quiet_keys) == quiet_blocks
        figures = tenants.stats()["tenants"]
        assert figures["noisy"]["tiers"]["redis"]["evictions"] >= 27
        assert figures["quiet"]["tiers"]["redis"]["evictions"] == 0
        redis_stats = noisy.stats()["tiers"][0]["backend_stats"]
        assert redis_stats["tenant_bytes.noisy"] <= 200 * 1024
        assert redis_stats["tenant_bytes.quiet"] > 4 * 16 * 1024  # framed: a header more
