"""contrib/kvtier-redis: deadlines (``kvtier_expire``) on a real server.

A deadline brings the block's TTL forward on the server, in one Lua script, so
every connection and process sharing the space misses the block from then on,
and the next script counts its bytes off (``expired``).  A later deadline, or
the tier's own ``expire``, never puts it off; with ``unused``, a read does not
push the expiry past it.  On a cluster, each shard sets its part.

The deadline is recorded on the server too, so ``kvtier_deadlines`` of another
connection reads it (in the server's time): the earlier of two, never the
tier's own ``expire``, none once the block left (a block stored again has
none), and asking is no use of the block.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from redis_server import RedisServer
from redis_tenants import block, fresh_url, open_tenant

from kvtier.testing.deadlines import DeadlinesTests
from kvtier.testing.expire import ExpireTests

NS_A = "a" * 32
NS_B = "b" * 32
DB = 10


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    return fresh_url(redis_server, DB)


class TestRedisExpireKit(ExpireTests):
    """The kit's ``expire`` group on a pool with a capacity and ``unused``: the script's
    bookkeeping path."""

    backend = "redis"

    @pytest.fixture
    def backend_options(self, redis_server: RedisServer) -> dict[str, Any]:
        return {"url": redis_server.url(DB + 1), "prefix": "kitexp", "capacity": "4MiB",
                "tenants": {"*": {"quota": "2MiB"}}, "expire": {"unused": "1h"}}

    @pytest.fixture(autouse=True)
    def _fresh_database(self, redis_server: RedisServer) -> None:
        fresh_url(redis_server, DB + 1)


class TestRedisDeadlinesKit(DeadlinesTests):
    """The kit's ``deadlines`` group on the same pool: the deadlines read back from the
    server."""

    backend = "redis"

    @pytest.fixture
    def backend_options(self, redis_server: RedisServer) -> dict[str, Any]:
        return {"url": redis_server.url(DB + 1), "prefix": "kitdl", "capacity": "4MiB",
                "tenants": {"*": {"quota": "2MiB"}}, "expire": {"unused": "1h"}}

    @pytest.fixture(autouse=True)
    def _fresh_database(self, redis_server: RedisServer) -> None:
        fresh_url(redis_server, DB + 1)


@pytest.mark.parametrize("options", [
    {}, {"capacity": "1MiB"}, {"tenants": {"*": {"quota": "1MiB"}}}], ids=["plain", "capacity",
                                                                        "pool"])
def test_every_connection_misses_a_block_past_its_deadline(url: str, options: Any) -> None:
    a, other = open_tenant(url, "a", NS_A, **options), open_tenant(url, "a", NS_A, **options)
    try:
        mine = [b"k0", b"k1", b"k2"]
        assert a.kvtier_put(mine, [block(i) for i in range(3)], []) == [True] * 3
        assert a.kvtier_expire([b"k0", b"k2", b"absent"], 0.4) == [True, True, None]
        start = time.monotonic()
        time.sleep(max(0.0, start + 0.45 - time.monotonic()))
        assert other.kvtier_get(mine) == [None, block(1), None]
        assert other.kvtier_lookup([b"k0", b"k2"]) == [False, False]
        if options:  # with bookkeeping: the bytes are counted off, as expired
            stats = other.kvtier_stats()
            assert stats["blocks"] == 1 and stats["used_bytes"] == 1000
            assert sum(v for k, v in stats.items() if k.startswith("tenant_expired")) == 2
    finally:
        a.kvtier_close()
        other.kvtier_close()


def test_never_later_than_the_tier_s_expire_nor_an_earlier_deadline(url: str) -> None:
    a = open_tenant(url, "a", NS_A, expire="1.5s")
    try:
        mine = [b"k0", b"k1", b"k2"]
        assert a.kvtier_put(mine, [block(i) for i in range(3)], []) == [True] * 3
        assert a.kvtier_expire([b"k0"], 0.3) == [True]
        start = time.monotonic()
        assert a.kvtier_expire([b"k0", b"k1"], 3600) == [True, True]
        time.sleep(max(0.0, start + 0.5 - time.monotonic()))
        assert a.kvtier_get(mine) == [None, block(1), block(2)]
        time.sleep(max(0.0, start + 1.6 - time.monotonic()))
        assert a.kvtier_get(mine) == [None, None, None]
    finally:
        a.kvtier_close()


def test_a_read_does_not_push_the_expiry_past_the_deadline(url: str) -> None:
    a = open_tenant(url, "a", NS_A, expire={"unused": "1h"})
    try:
        assert a.kvtier_put([b"k0"], [block(0)], []) == [True]
        assert a.kvtier_expire([b"k0"], 0.6) == [True]
        start = time.monotonic()
        while time.monotonic() < start + 0.4:  # each read is a use: unused pushes back
            assert a.kvtier_get([b"k0"]) in ([block(0)], [None])
            time.sleep(0.05)
        time.sleep(max(0.0, start + 0.65 - time.monotonic()))
        assert a.kvtier_get([b"k0"]) == [None]
    finally:
        a.kvtier_close()


def test_a_block_stored_again_after_its_deadline_has_none(url: str) -> None:
    a = open_tenant(url, "a", NS_A, tenants={"*": {"quota": "1MiB"}}, expire={"unused": "1h"})
    try:
        assert a.kvtier_put([b"k0"], [block(0)], []) == [True]
        assert a.kvtier_expire([b"k0"], 0.3) == [True]
        time.sleep(0.4)
        assert a.kvtier_get([b"k0"]) == [None]
        assert a.kvtier_put([b"k0"], [block(5)], []) == [True]
        time.sleep(0.4)
        assert a.kvtier_get([b"k0"]) == [block(5)]
    finally:
        a.kvtier_close()


def test_on_a_cluster_each_shard_sets_its_part(redis_cluster: Any) -> None:
    options = {"cluster": True, "prefix": "td", "shards": 4,
               "tenants": {"*": {"quota": 64_000}}}
    a = open_tenant(redis_cluster.url, "a", NS_A, **options)
    b = open_tenant(redis_cluster.url, "b", NS_B, **options)
    try:
        mine = [f"k{i}".encode() for i in range(16)]
        assert a.kvtier_put(mine, [block(i, 500) for i in range(16)], []) == [True] * 16
        assert b.kvtier_put(mine, [block(100 + i, 500) for i in range(16)], []) == [True] * 16
        assert a.kvtier_expire([*mine[:8], b"absent"], 0.4) == [True] * 8 + [None]
        time.sleep(0.5)
        assert a.kvtier_get(mine) == [None] * 8 + [block(i, 500) for i in range(8, 16)]
        assert b.kvtier_get(mine) == [block(100 + i, 500) for i in range(16)]
    finally:
        a.kvtier_close()
        b.kvtier_close()
        redis_cluster.flush()


#: A deadline given in the tests that read it back, in seconds: far off, so a slow
#: machine reads it with time left.
FAR = 600.0


def left_within(left: float | None, most: float) -> bool:
    """A deadline read back ``most`` seconds off at most, and less than a minute gone."""
    return left is not None and most - 60 < left <= most


@pytest.mark.parametrize("options", [
    {}, {"capacity": "1MiB", "expire": {"unused": "1h"}},
    {"tenants": {"*": {"quota": "1MiB"}}}], ids=["plain", "capacity", "pool"])
def test_another_connection_reads_the_deadline_one_set(url: str, options: Any) -> None:
    a, b = open_tenant(url, "a", NS_A, **options), open_tenant(url, "a", NS_A, **options)
    try:
        mine = [b"k0", b"k1", b"k2"]
        assert a.kvtier_put(mine, [block(i) for i in range(3)], []) == [True] * 3
        assert b.kvtier_deadlines([*mine, b"absent"]) == [None] * 4
        assert a.kvtier_expire([b"k0"], FAR) == [True]
        assert a.kvtier_expire([b"k2"], 2 * FAR) == [True]
        k0, k1, k2, absent = b.kvtier_deadlines([*mine, b"absent"])
        assert left_within(k0, FAR) and left_within(k2, 2 * FAR), (k0, k2)
        assert (k1, absent) == (None, None)
        # the earlier of two deadlines stays, whoever gives the later one
        assert b.kvtier_expire([b"k0"], 3 * FAR) == [True]
        assert a.kvtier_expire([b"k2"], FAR / 2) == [True]
        k0, _, k2 = a.kvtier_deadlines(mine)
        assert left_within(k0, FAR) and left_within(k2, FAR / 2), (k0, k2)
        # asking changes nothing: the blocks read back, byte for byte
        assert b.kvtier_get(mine) == [block(i) for i in range(3)]
    finally:
        a.kvtier_close()
        b.kvtier_close()


def test_a_block_evicted_and_stored_again_has_no_deadline(url: str) -> None:
    # the tier's own expire is sooner than the deadline: the blocks stored again have a
    # TTL within it, so only the deadline's removal tells them from the ones before
    a = open_tenant(url, "a", NS_A, capacity=2500, expire="5m")
    try:
        assert a.kvtier_put([b"k0", b"k1"], [block(0), block(1)], []) == [True, True]
        assert a.kvtier_expire([b"k0", b"k1"], FAR) == [True, True]
        assert all(left_within(s, FAR) for s in a.kvtier_deadlines([b"k0", b"k1"]))
        assert a.kvtier_evict([b"k0"]) == [True]
        evicted: list[Any] = []  # k1, the least recently used, makes room
        assert a.kvtier_put([b"k2", b"k3"], [block(2), block(3)], evicted) == [True, True]
        assert [k for k, _ in evicted] == [b"k1"]
        assert a.kvtier_deadlines([b"k0", b"k1"]) == [None, None]
        assert a.kvtier_put([b"k0", b"k1"], [block(5), block(6)], []) == [True, True]
        assert a.kvtier_deadlines([b"k0", b"k1"]) == [None, None]
        assert a.kvtier_get([b"k0", b"k1"]) == [block(5), block(6)]
    finally:
        a.kvtier_close()


def test_the_tier_s_own_expire_is_no_deadline_and_a_passed_one_is_none(url: str) -> None:
    a = open_tenant(url, "a", NS_A, expire={"after": "1h", "unused": "0.8s"})
    try:
        assert a.kvtier_put([b"k0", b"k1"], [block(0), block(1)], []) == [True, True]
        assert a.kvtier_deadlines([b"k0", b"k1"]) == [None, None]
        assert a.kvtier_expire([b"k1"], 0.3) == [True]
        start = time.monotonic()
        time.sleep(0.5)
        assert a.kvtier_deadlines([b"k0", b"k1"]) == [None, None]
        # asking is no use: k0 still expires `unused` after its put
        time.sleep(max(0.0, start + 0.9 - time.monotonic()))
        assert a.kvtier_get([b"k0", b"k1"]) == [None, None]
    finally:
        a.kvtier_close()


def test_on_a_cluster_each_shard_answers_its_deadlines(redis_cluster: Any) -> None:
    options = {"cluster": True, "prefix": "tl", "shards": 4}
    a = open_tenant(redis_cluster.url, "a", NS_A, **options)
    b = open_tenant(redis_cluster.url, "a", NS_A, **options)
    try:
        mine = [f"k{i}".encode() for i in range(16)]
        assert a.kvtier_put(mine, [block(i, 500) for i in range(16)], []) == [True] * 16
        assert a.kvtier_expire(mine[:8], FAR) == [True] * 8
        left = b.kvtier_deadlines([*mine, b"absent"])
        assert all(left_within(s, FAR) for s in left[:8]), left
        assert left[8:] == [None] * 9
    finally:
        a.kvtier_close()
        b.kvtier_close()
        redis_cluster.flush()
