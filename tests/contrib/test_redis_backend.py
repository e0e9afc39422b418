"""contrib/kvtier-redis: the ``redis`` backend against a real ``redis-server``.

The server is Debian's ``redis-server`` started by :mod:`redis_server` on a
free port, without persistence files.  The conformance kit runs on the
backend with a capacity (every group applies) and without one (large blocks);
``kvtier conformance redis`` certifies it in a subprocess as a CI would; a
YAML-configured chain stores through it; and the faults a network store has
(server gone, script cache flushed, wrong address) surface as the contract's
typed errors.  Blocks are compared byte for byte, also straight from Redis.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kvtier_redis import RedisBackend
from kvtier_redis import __version__ as redis_backend_version
from redis_server import RedisServer

import kvtier
from kvtier.config import load_config
from kvtier.plugins.registry import ENTRY_POINT_GROUP, BackendRegistry
from kvtier.spec import CONTRACT_VERSION, BackendError, ClosedError, ConfigError, KvtierError
from kvtier.testing import GROUPS, BackendTests, RawAccess

ROOT = Path(__file__).resolve().parents[2]
NS = "0123456789abcdef0123456789abcdef"
OTHER_NS = "fedcba9876543210fedcba9876543210"

# One database per user of the shared server, so that flushing one after a
# test never touches another's keys.
DB_KIT, DB_KIT_UNBOUNDED, DB_CLI, DB_CHAIN, DB_DIRECT = 1, 2, 3, 4, 5


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


def raw_client(server: RedisServer, db: int) -> redis.Redis:
    """A plain client, to look at what the backend wrote without going through it."""
    return redis.Redis.from_url(server.url(db))


def flush(server: RedisServer, db: int) -> None:
    with raw_client(server, db) as client:
        client.flushdb()


def block(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


# --- the conformance kit ---------------------------------------------------------


class TestRedisKit(BackendTests):
    """With a capacity every group of the kit applies, capacity and corruption included."""

    backend = "redis"

    @pytest.fixture
    def backend_options(self, redis_server: RedisServer) -> dict[str, Any]:
        return {
            "url": redis_server.url(DB_KIT),
            "prefix": "kit",
            "capacity": "4MiB",
            "max_block_size": "2MiB",
        }

    @pytest.fixture(autouse=True)
    def _fresh_database(self, redis_server: RedisServer) -> Iterator[None]:
        # each test has its own namespace already; this only bounds the
        # server's memory over the run
        yield
        flush(redis_server, DB_KIT)


class TestRedisKitUnbounded(BackendTests):
    """Without a capacity: blocks up to 8 MiB round-trip, nothing is ever evicted."""

    backend = "redis"
    crash_max_bytes = 32 * 1024 * 1024  # nothing evicts: bound what a writer leaves

    @pytest.fixture
    def backend_options(self, redis_server: RedisServer) -> dict[str, Any]:
        return {"url": redis_server.url(DB_KIT_UNBOUNDED), "batch_bytes": "1MiB"}

    @pytest.fixture(autouse=True)
    def _fresh_database(self, redis_server: RedisServer) -> Iterator[None]:
        yield
        flush(redis_server, DB_KIT_UNBOUNDED)

    def test_declares_no_capacity(self) -> None:
        assert self.caps.capacity is None and self.caps.persistent and self.caps.shared
        assert "capacity_bytes" not in self.store.stats()


def test_cli_certifies_the_redis_backend(redis_server: RedisServer, tmp_path: Path) -> None:
    """``kvtier conformance redis`` as a CI job runs it: exit status 0 and a passing report."""
    kvtier_cli = Path(sys.executable).with_name("kvtier")
    assert kvtier_cli.exists(), f"the kvtier command is not installed next to {sys.executable}"
    report_path = tmp_path / "conformance.json"
    url = redis_server.url(DB_CLI)
    argv = [
        str(kvtier_cli), "conformance", "redis",
        "--option", f"url={url}",
        "--option", "capacity=4MiB",
        "--report", str(report_path),
    ]
    env = dict(os.environ, COLUMNS="200")
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900
        )
    finally:
        flush(redis_server, DB_CLI)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["backend"] == "redis"
    assert (report["distribution"], report["version"]) == ("kvtier-redis", redis_backend_version)
    assert report["contract_version"] == CONTRACT_VERSION
    assert report["verdict"] == "pass"
    assert report["options"] == {"url": url, "capacity": "4MiB"}
    assert report["totals"]["failed"] == 0 and report["totals"]["passed"] > 60
    assert set(report["groups"]) == set(GROUPS)
    # with a capacity and kit_tamper, every group applies but framed (redis
    # stores any bytes); only the checks of the optional zero-copy hooks, of
    # blocks over the limits and of a kept block under pressure skip (without
    # `tenants` no budget: every mark is refused, checked with one below)
    # (and kvtier_expire, contract 1.3's deadlines per block, where the kit has it:
    # redis gives blocks the tier's `expire` only)
    expected_skips = ("kvtier_put_parts", "kvtier_get_into", "limit of", "too large",
                      "give no keep budget", "kvtier_expire")
    framed = report["groups"].pop("framed")
    assert framed["skip_reasons"] == ["backend 'redis' does not declare framed_only=True"]
    expire = report["groups"].pop("expire", None)
    assert expire is None or expire["failed"] == 0
    assert report["groups"]["keep"]["passed"] == 1
    for name, group in report["groups"].items():
        assert group["selected"] and group["failed"] == 0, (name, group)
        assert group["passed"] > 0, (name, group)
        for reason in group["skip_reasons"]:
            assert any(text in reason for text in expected_skips), (name, reason)
    # the capacity holds, a larger block is refused, evict's removals are never
    # reported as evictions, and the evictions figure counts what capacity pushed out
    assert report["groups"]["capacity"]["passed"] == 4
    assert report["groups"]["corruption"]["passed"] == 8
    assert "kvtier-redis 0.1.0" in proc.stdout and "PASS" in proc.stdout


def test_cli_certifies_the_redis_backends_keep(redis_server: RedisServer, tmp_path: Path) -> None:
    """``kvtier conformance redis --group keep`` with a budget: a block kept through three
    capacities of other puts (the kit's every keep check passes, none skips)."""
    report_path = tmp_path / "keep.json"
    argv = [
        str(Path(sys.executable).with_name("kvtier")), "conformance", "redis", "--group", "keep",
        "--option", f"url={redis_server.url(DB_CLI)}", "--option", "capacity=4MiB",
        "--option", "tenants={'*': {keep: 1MiB}}", "--report", str(report_path),
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                              env=dict(os.environ, COLUMNS="200"))
    finally:
        flush(redis_server, DB_CLI)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["verdict"] == "pass" and report["options"]["tenants"] == {"*": {"keep": "1MiB"}}
    keep = report["groups"]["keep"]
    assert (keep["passed"], keep["failed"], keep["skip_reasons"]) == (2, 0, [])


# --- registration -----------------------------------------------------------------


def test_entry_point_is_discovered() -> None:
    (entry,) = [
        ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "redis"
    ]
    assert entry.value == "kvtier_redis.backend:RedisBackend"
    assert entry.dist is not None and entry.dist.name == "kvtier-redis"
    registry = BackendRegistry()
    assert "redis" in registry.names()
    info = registry.info("redis")
    assert (info.distribution, info.version) == ("kvtier-redis", redis_backend_version)
    handle = registry.create("redis")
    assert type(handle.instance) is RedisBackend
    assert isinstance(handle.instance, RawAccess) and not handle.implements("kvtier_tamper")
    assert not handle.implements("kvtier_put_parts") and not handle.implements("kvtier_get_into")
    assert {"url", "prefix", "capacity", "timeout", "password"} <= set(handle.options())
    assert handle.options()["password"].secret
    # an instance never opened answers for its defaults, without a server
    caps = handle.capabilities()
    assert (caps.persistent, caps.shared, caps.reports_evictions) == (True, True, True)
    assert caps.capacity is None and caps.max_block_size == 512 * 1024 * 1024


def test_kvtier_backends_lists_it() -> None:
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("kvtier")), "backends"],
        capture_output=True, text=True, env=dict(os.environ, COLUMNS="200"), timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    (line,) = [row for row in proc.stdout.splitlines() if "kvtier-redis" in row]
    assert "redis" in line and redis_backend_version in line


def test_kvtier_core_does_not_import_it() -> None:
    """Core knows the distribution's name for one thing only: the hint to install it."""
    hints = ROOT / "sdk" / "plugins" / "registry.py"
    for tree in ("sdk", "spec", "backends"):
        for path in (ROOT / tree).rglob("*.py"):
            text = path.read_text()
            assert "kvtier_redis" not in text, path
            if path != hints:
                assert "kvtier-redis" not in text, path
    assert hints.read_text().count("kvtier-redis") == 1
    from kvtier.plugins.registry import INSTALL_HINTS

    assert INSTALL_HINTS["redis"] == "pip install kvtier-redis"


# --- a chain configured in YAML ---------------------------------------------------


def chain_yaml(path: Path, url: str, write: str) -> Path:
    path.write_text(
        "version: 1\n"
        "chain:\n"
        "  - name: ram\n"
        "    backend: host\n"
        "    capacity: 64KiB\n"
        "  - name: redis\n"
        "    backend: redis\n"
        f"    url: {url}\n"
        "    prefix: yaml\n"
        "    capacity: 8MiB\n"
        "    timeout: 5s\n"
        f"    write: {write}\n"
    )
    return path


@pytest.mark.parametrize("write", ["through", "back"])
def test_yaml_chain_round_trip(redis_server: RedisServer, tmp_path: Path, write: str) -> None:
    flush(redis_server, DB_CHAIN)
    config = chain_yaml(tmp_path / "chain.yaml", redis_server.url(DB_CHAIN), write)
    namespace = kvtier.Namespace("tiny-llama", dtype="bfloat16", tokens_per_block=16)
    keys = [f"prefix-hash-{i}".encode() for i in range(24)]
    blocks = [block(i, 16 * 1024 + i) for i in range(24)]
    with kvtier.open_chain(config, namespace=namespace) as chain:
        assert [t.name for t in chain.tiers] == ["ram", "redis"]
        assert chain.put(keys, blocks) == [True] * 24
        assert chain.flush(timeout=30)
        # 64 KiB of RAM holds three blocks: the others are served by Redis
        tiers = chain.lookup(keys)
        assert all(t is not None for t in tiers) and tiers.count(1) >= 20, tiers
        outs = [bytearray(len(b)) for b in blocks]
        assert chain.get(keys, outs) == [True] * 24
        assert [bytes(o) for o in outs] == blocks
        assert chain.stats()["tiers"][1]["hits"] >= 20
    # Redis holds framed blocks (header + payload) under the documented keys
    with raw_client(redis_server, DB_CHAIN) as client:
        stored = client.keys(f"yaml:{namespace.hex}:b:*".encode())
        in_redis = {k.split(b":b:", 1)[1] for k in stored}
        assert in_redis <= set(keys) and len(in_redis) >= 21
        for key, want in zip(keys, blocks):
            if key in in_redis:
                raw = client.get(f"yaml:{namespace.hex}:b:".encode() + key)
                assert raw is not None and raw.endswith(want) and len(raw) > len(want)
    # a new chain (empty RAM) reads what Redis kept, byte for byte
    with kvtier.open_chain(config, namespace=namespace) as chain:
        got = chain.get_bytes(keys)
        for key, want, have in zip(keys, blocks, got):
            if key in in_redis:
                assert have == want, key
        assert chain.lookup([b"never-stored"]) == [None]
    # another namespace (another model) sees none of it
    other = kvtier.Namespace("other-model", dtype="bfloat16", tokens_per_block=16)
    with kvtier.open_chain(config, namespace=other) as chain:
        assert chain.get_bytes(keys) == [None] * 24
    flush(redis_server, DB_CHAIN)


def test_chain_serves_misses_while_redis_is_down(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "server") as server:
        config = chain_yaml(tmp_path / "chain.yaml", server.url(0), "through")
        keys, blocks = [b"a", b"b"], [block(1, 5000), block(2, 70_000)]
        with kvtier.open_chain(config, namespace="down-model") as chain:
            assert chain.put(keys, blocks) == [True, True]
            assert chain.flush(timeout=30)
            server.stop()
            # "b" is not in RAM (70 KB > 64 KiB); Redis is gone: a miss, not an error
            assert chain.get_bytes(keys) == [blocks[0], None]


# --- the backend alone ------------------------------------------------------------


@pytest.fixture
def direct(redis_server: RedisServer) -> Iterator[str]:
    flush(redis_server, DB_DIRECT)
    yield redis_server.url(DB_DIRECT)
    flush(redis_server, DB_DIRECT)


def open_backend(namespace: str = NS, **options: Any) -> RedisBackend:
    backend = RedisBackend()
    backend.kvtier_open(options, namespace)
    return backend


def test_blocks_are_stored_raw_under_the_prefix(direct: str, redis_server: RedisServer) -> None:
    backend = open_backend(url=direct, prefix="layout")
    keys = [b"\x00\xff binary:key", b"k" * 64]
    blocks = [block(3, 1000), block(4, 300_001)]
    assert backend.kvtier_put(keys, [bytearray(blocks[0]), memoryview(blocks[1])], []) == [
        True, True,
    ]
    with raw_client(redis_server, DB_DIRECT) as client:
        for key, want in zip(keys, blocks):
            assert client.get(f"layout:{NS}:b:".encode() + key) == want
        assert set(client.keys(b"layout:*")) == {
            *(f"layout:{NS}:b:".encode() + k for k in keys),
            *(f"layout:{NS}:{name}".encode() for name in ("lru", "size", "meta")),
        }
    assert backend.kvtier_stats() == {"used_bytes": 301_001, "blocks": 2, "evictions": 0,
                                      "tenant_bytes.default": 301_001, "kept_blocks": 0,
                                      "kept_bytes": 0, "keep_refused": 0}
    backend.kvtier_close()


def test_least_recently_used_is_evicted_and_reported(direct: str) -> None:
    backend = open_backend(url=direct, capacity=3000)
    keys = [b"a", b"b", b"c", b"d"]
    blocks = [block(10 + i, 1000) for i in range(4)]
    assert backend.kvtier_put(keys[:3], blocks[:3], []) == [True] * 3
    assert backend.kvtier_get([b"a"]) == [blocks[0]]  # "b" is now the oldest
    evicted: list[tuple[bytes, Any]] = []
    assert backend.kvtier_put([b"d"], [blocks[3]], evicted) == [True]
    assert evicted == [(b"b", blocks[1])]
    assert backend.kvtier_get(keys) == [blocks[0], None, blocks[2], blocks[3]]
    assert backend.kvtier_lookup(keys) == [True, False, True, True]
    assert backend.kvtier_stats() == {
        "used_bytes": 3000, "blocks": 3, "evictions": 1, "capacity_bytes": 3000,
        "tenant_bytes.default": 3000, "tenant_evicted.default": 1,
        "kept_blocks": 0, "kept_bytes": 0, "keep_refused": 0,
    }
    # larger than the capacity: refused, and nothing is pushed out for it
    evicted.clear()
    assert backend.kvtier_put([b"e"], [bytes(3001)], evicted) == [False]
    assert evicted == [] and backend.kvtier_stats()["blocks"] == 3
    backend.kvtier_close()


def test_instances_share_one_store_and_its_capacity(direct: str) -> None:
    first = open_backend(url=direct, capacity=2500)
    second = open_backend(url=direct, capacity=2500)
    other_ns = open_backend(OTHER_NS, url=direct, capacity=2500)
    one, two = block(20, 1000), block(21, 1000)
    assert first.kvtier_put([b"x"], [one], []) == [True]
    assert second.kvtier_get([b"x"]) == [one]
    evicted: list[tuple[bytes, Any]] = []
    assert second.kvtier_put([b"y", b"z"], [two, two], evicted) == [True, True]
    assert evicted == [(b"x", one)]  # the other instance's block, counted against one capacity
    assert first.kvtier_lookup([b"x", b"y", b"z"]) == [False, True, True]
    assert other_ns.kvtier_lookup([b"y"]) == [False]
    assert other_ns.kvtier_stats()["used_bytes"] == 0
    for backend in (first, second, other_ns):
        backend.kvtier_close()


def test_lost_script_cache_is_reloaded(direct: str, redis_server: RedisServer) -> None:
    backend = open_backend(url=direct, capacity="1MiB")
    with raw_client(redis_server, DB_DIRECT) as client:
        client.script_flush()
    data = block(30, 4096)
    assert backend.kvtier_put([b"k"], [data], []) == [True]
    assert backend.kvtier_get([b"k"]) == [data]
    with raw_client(redis_server, DB_DIRECT) as client:
        client.script_flush()
    assert backend.kvtier_evict([b"k", b"k"]) == [True, False]
    backend.kvtier_close()


def test_a_block_deleted_behind_its_back_is_a_miss(direct: str, redis_server: RedisServer) -> None:
    backend = open_backend(url=direct, capacity=5000)
    data = block(31, 2000)
    assert backend.kvtier_put([b"gone"], [data], []) == [True]
    with raw_client(redis_server, DB_DIRECT) as client:
        client.delete(f"kvtier:{NS}:b:gone".encode())
    assert backend.kvtier_get([b"gone"]) == [None]
    assert backend.kvtier_lookup([b"gone"]) == [False]
    # put again: the stale size is forgotten, not counted twice
    assert backend.kvtier_put([b"gone"], [data], []) == [True]
    assert backend.kvtier_stats()["used_bytes"] == 2000
    assert backend.kvtier_get([b"gone"]) == [data]
    backend.kvtier_close()


def test_a_failed_put_still_reports_what_it_evicted(
    direct: str, redis_server: RedisServer
) -> None:
    backend = open_backend(url=direct, capacity=2000, batch_bytes=1000)
    old, new, late = block(40, 1000), block(41, 1000), block(42, 1000)
    assert backend.kvtier_put([b"old"], [old], []) == [True]
    # damaged bookkeeping makes the script of the put's second batch fail
    with raw_client(redis_server, DB_DIRECT) as client:
        client.hset(f"kvtier:{NS}:size".encode(), b"late", b"not a number")
    evicted: list[tuple[bytes, Any]] = []
    with pytest.raises(BackendError, match="ResponseError"):
        backend.kvtier_put([b"new", b"pad", b"late"], [new, new, late], evicted)
    # the batches before stored "new" and "pad", pushing "old" out: it was handed over
    assert evicted == [(b"old", old)]
    assert backend.kvtier_get([b"old", b"new", b"late"]) == [None, new, None]
    backend.kvtier_close()


def test_server_faults_raise_backend_error(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "server")
    with server:
        backend = open_backend(url=server.url(0), capacity="1MiB", timeout="2s", retries=0)
        assert backend.kvtier_put([b"k"], [b"v"], []) == [True]
        server.stop()
        for call in (
            lambda: backend.kvtier_put([b"k2"], [b"v"], []),
            lambda: backend.kvtier_get([b"k"]),
            lambda: backend.kvtier_lookup([b"k"]),
            lambda: backend.kvtier_evict([b"k"]),
            backend.kvtier_stats,
        ):
            with pytest.raises(BackendError, match=f"127.0.0.1:{server.port}"):
                call()
        server.start()  # a restart: persistence is off, so the store is empty
        assert backend.kvtier_get([b"k"]) == [None]
        assert backend.kvtier_put([b"k"], [b"v2"], []) == [True]
        assert backend.kvtier_get([b"k"]) == [b"v2"]
        backend.kvtier_close()
        backend.kvtier_close()
        with pytest.raises(ClosedError):
            backend.kvtier_get([b"k"])


def test_unreachable_server_at_open_names_it_without_the_password(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "server") as server:
        port = server.port
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    with pytest.raises(BackendError) as err:
        open_backend(url=url, connect_timeout="1s", retries=0)
    assert f"redis://127.0.0.1:{port}/0" in str(err.value)
    assert "hunter2" not in str(err.value)


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"url": "http://127.0.0.1:6379"}, "url"),
        ({"capacity": "-1"}, "capacity"),
        ({"max_block_size": "1GiB"}, "max_block_size"),
        ({"prefix": ""}, "prefix"),
        ({"retries": -1}, "retries"),
        ({"url": "redis://:pw@127.0.0.1:6379/0", "password": "pw"}, "password"),
        ({"colour": "blue"}, "colour"),
        # NaN passes every range check; infinity overflows (issue 37, item 9)
        ({"timeout": float("nan")}, "timeout"),
        ({"connect_timeout": float("inf")}, "connect_timeout"),
        ({"capacity": "1" + "0" * 400 + "GiB"}, "capacity"),
    ],
)
def test_bad_options_are_config_errors(options: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        RedisBackend().kvtier_open(options, NS)
    assert err.value.key == key
    if "password" in options:
        assert "pw" not in str(err.value).replace("password", "")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("url: memcached://h:1", "redis://"),
        ("capacity: 0", "at least 1"),
        ("concurrency: 0", "expected 1 or more, got 0"),
        ("max_connections: 0", "expected 1 or more, got 0"),  # the old key, named as written
        ("batch_bytes: 0", "at least 1"),
        ("timeout: .nan", "expected a finite number, got nan"),
        ("connect_timeout: .inf", "expected a finite number, got inf"),
    ],
)
def test_yaml_config_rejects_bad_values(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "chain.yaml"
    path.write_text(f"chain:\n  - name: r\n    backend: redis\n    {line}\n")
    # caught while the file is validated, before any connection is tried
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    assert err.value.where is not None and "chain.yaml:4" in err.value.where
    assert err.value.key == f"chain[0].{line.split(':')[0]}"


def test_use_after_close_and_double_open(direct: str) -> None:
    backend = open_backend(url=direct)
    with pytest.raises(KvtierError, match="already open"):
        backend.kvtier_open({"url": direct}, NS)
    backend.kvtier_close()
    backend.kvtier_close()
    for call in (
        lambda: backend.kvtier_put([b"k"], [b"v"], []),
        lambda: backend.kit_tamper(b"k", lambda b: b),
        backend.kvtier_capabilities,
        lambda: backend.kvtier_open({"url": direct}, NS),
    ):
        with pytest.raises(ClosedError):
            call()
    assert "url" in backend.kvtier_options()  # introspection still answers
