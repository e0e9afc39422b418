"""kvtier_scan (contract 1.1) on every built-in backend and kvtier-redis, against real stores.

Each backend lists exactly the blocks stored (key and stored size, byte for
byte the length ``kvtier_get`` returns), per namespace and for the whole
store, never its own bookkeeping or another tier's data, stops listing what
was evicted, and raises ClosedError once closed.  The peer backend declines
with a clear error.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis_cluster import RedisClusterServer
from redis_server import RedisServer
from seaweed import SeaweedServer

from kvtier.config.chain_config import load_config
from kvtier.plugins.registry import BackendHandle, BackendRegistry
from kvtier.spec import ClosedError, ContractError, PluginError, ScanEntry, hookimpl

Opener = Callable[[str], BackendHandle]

# keys a store must not mangle: a NUL, the longest key, path and glob characters
KEYS = [b"\x00", b"k" * 64, b"a/b:c*?[x]", b"plain-1", b"plain-2", bytes(range(200, 232))]


def blocks_for(namespace: str) -> dict[bytes, bytes]:
    """Different sizes per key and per namespace, so a mix-up shows."""
    seed = int(namespace[:4], 16) % 97
    return {key: os.urandom(100 + 37 * i + seed) for i, key in enumerate(KEYS)}


def listed(handle: BackendHandle, namespace: str | None) -> list[ScanEntry]:
    batches = list(handle.scan(namespace))
    assert all(isinstance(b, list) and b for b in batches), "a batch is empty or not a list"
    return [entry for batch in batches for entry in batch]


def as_set(entries: list[ScanEntry]) -> set[tuple[str, bytes, int]]:
    return {(e.namespace, e.key, e.size) for e in entries}


def expected(namespace: str, blocks: dict[bytes, bytes]) -> set[tuple[str, bytes, int]]:
    return {(namespace, key, len(data)) for key, data in blocks.items()}


def check_store(open_backend: Opener, *, shares_namespaces: bool = True) -> None:
    """The checks every backend passes; ``shares_namespaces``: one store holds many."""
    ns_a, ns_b = secrets.token_hex(16), secrets.token_hex(16)
    a, b = open_backend(ns_a), open_backend(ns_b)
    data_a, data_b = blocks_for(ns_a), blocks_for(ns_b)
    started = time.time()
    assert a.put(list(data_a), list(data_a.values()), []) == [True] * len(KEYS)
    assert b.put(list(data_b), list(data_b.values()), []) == [True] * len(KEYS)
    # a repeated put with other bytes keeps the first: the scan reports the stored size
    assert a.put([KEYS[0]], [b"other bytes, longer than before" * 10], []) == [True]
    assert [len(bytes(g)) for g in a.get(list(data_a)) if g is not None] == [
        len(d) for d in data_a.values()]

    mine = listed(a, ns_a)
    assert len(mine) == len(KEYS), "a block listed twice, or missing"
    assert as_set(mine) == expected(ns_a, data_a)
    for entry in mine:
        assert entry.mtime is None or started - 60 <= entry.mtime <= time.time() + 60
    everything = as_set(listed(a, None))
    if shares_namespaces:
        assert expected(ns_a, data_a) | expected(ns_b, data_b) <= everything
        assert as_set(listed(a, ns_b)) == expected(ns_b, data_b), "another namespace, by name"
    else:
        assert everything == expected(ns_a, data_a)
        assert listed(a, ns_b) == []

    assert a.evict([KEYS[1], KEYS[2]]) == [True, True]
    assert as_set(listed(a, ns_a)) == expected(ns_a, {k: data_a[k] for k in KEYS if k not in
                                                      (KEYS[1], KEYS[2])})
    assert listed(a, secrets.token_hex(16)) == [], "an unknown namespace lists nothing"
    a.close()
    with pytest.raises(ClosedError):
        a.scan(ns_a)
    b.close()


@contextlib.contextmanager
def opener_for(backend: str, entry: dict[str, Any]) -> Iterator[Opener]:
    """Opens instances as a chain would (options validated and parsed); closes them after."""
    registry = BackendRegistry()
    config = load_config({"chain": [{"name": "t", "backend": backend, **entry}]},
                         registry=registry)
    handles: list[BackendHandle] = []

    def opener(namespace: str) -> BackendHandle:
        handle = registry.create(backend)
        handle.open(config.tiers[0].options, namespace)
        handles.append(handle)
        return handle

    try:
        yield opener
    finally:
        for handle in handles:
            handle.close()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis-scan")) as server:
        yield server


def test_host_lists_its_own_namespace() -> None:
    with opener_for("host", {"capacity": "1MiB"}) as open_backend:
        check_store(open_backend, shares_namespaces=False)


def test_host_scan_is_batched_and_not_a_use() -> None:
    ns = secrets.token_hex(16)
    with opener_for("host", {"capacity": "3000KiB"}) as open_backend:
        host = open_backend(ns)
        keys = [i.to_bytes(4, "big") for i in range(3000)]
        assert host.put(keys, [b"x" * 1024] * 3000, []) == [True] * 3000
        batches = list(host.scan(ns))
        assert len(batches) >= 3 and sum(len(b) for b in batches) == 3000
        # the scan saw every block; the LRU order is as before it: key 0 goes first
        evicted: list[tuple[bytes, Any]] = []
        assert host.put([b"new"], [b"y" * 1024], evicted) == [True]
        assert [k for k, _ in evicted] == [keys[0]]


def test_fs_local(tmp_path: Path) -> None:
    with opener_for("fs", {"url": f"file://{tmp_path}/kv"}) as open_backend:
        check_store(open_backend)


def test_fs_local_ignores_what_is_not_a_block(tmp_path: Path) -> None:
    ns = secrets.token_hex(16)
    with opener_for("fs", {"url": str(tmp_path)}) as open_backend:
        fs = open_backend(ns)
        assert fs.put([b"\x01\x02"], [b"block"], []) == [True]
        fan = tmp_path / ns / "01" / "02"
        (fan / ".tmp-123-abc").write_bytes(b"half a block")  # a writer in flight
        (fan / "zz.kvb").write_bytes(b"not hex")
        (tmp_path / ns / "0102.kvb").write_bytes(b"wrong directory")
        (tmp_path / "not-a-namespace").mkdir()
        (tmp_path / "not-a-namespace" / "0102.kvb").write_bytes(b"x")
        assert as_set(listed(fs, None)) == {(ns, b"\x01\x02", 5)}
        assert (fan / ".tmp-123-abc").exists(), "a scan removed a temp file"


def test_fs_memory() -> None:
    with opener_for("fs", {"url": f"memory://scan-{secrets.token_hex(4)}"}) as open_backend:
        check_store(open_backend)


def test_fs_on_s3(s3_server: SeaweedServer, bucket: str) -> None:
    with opener_for("fs", {
        "url": f"s3://{bucket}/fs",
        "storage_options": {"key": s3_server.access_key, "secret": s3_server.secret_key,
                            "endpoint_url": s3_server.endpoint}}) as open_backend:
        check_store(open_backend)


def object_entry(server: SeaweedServer, bucket: str, prefix: str) -> dict[str, Any]:
    return {"bucket": bucket, "endpoint": server.endpoint, "prefix": prefix,
            "access_key_id": server.access_key, "secret_access_key": server.secret_key,
            "region": server.region}


def test_object(s3_server: SeaweedServer, bucket: str) -> None:
    with opener_for("object", object_entry(s3_server, bucket, "kv/cache")) as open_backend:
        check_store(open_backend)


def test_object_lists_only_its_prefix(s3_server: SeaweedServer, bucket: str) -> None:
    ns = secrets.token_hex(16)
    with contextlib.ExitStack() as stack:
        mine, other, root = (
            stack.enter_context(opener_for("object", object_entry(s3_server, bucket, p)))(ns)
            for p in ("a", "ab", ""))
        _prefixes_apart(ns, mine, other, root)


def _prefixes_apart(ns: str, mine: BackendHandle, other: BackendHandle,
                    root: BackendHandle) -> None:
    assert mine.put([b"m"], [b"mine"], []) == [True]
    assert other.put([b"o"], [b"other!"], []) == [True]
    assert root.put([b"r"], [b"at the root"], []) == [True]
    assert as_set(listed(mine, None)) == {(ns, b"m", 4)}
    assert as_set(listed(other, ns)) == {(ns, b"o", 6)}
    # without a prefix, namespaces sit at the bucket's top: "a/..." is not one of them
    assert as_set(listed(root, None)) == {(ns, b"r", 11)}


def test_redis(redis_server: RedisServer) -> None:
    with opener_for("redis", {"url": redis_server.url(5), "capacity": "1MiB"}) as open_backend:
        check_store(open_backend)


def test_redis_cluster(tmp_path: Path) -> None:
    """Blocks spread over the masters' shards are listed from every master, once each."""
    with RedisClusterServer(tmp_path / "cluster") as cluster, \
            opener_for("redis", cluster.tier("t", shards=8, capacity="8MiB")) as open_backend:
        check_store(open_backend)


def test_redis_prefix_is_literal(redis_server: RedisServer) -> None:
    ns = secrets.token_hex(16)
    with opener_for("redis", {"url": redis_server.url(6), "prefix": "k*"}) as open_glob, \
            opener_for("redis", {"url": redis_server.url(6), "prefix": "kv"}) as open_plain:
        glob, plain = open_glob(ns), open_plain(ns)
        assert glob.put([b"g"], [b"glob"], []) == [True]
        assert plain.put([b"p:b:x"], [b"plain"], []) == [True]  # ":b:" inside a key
        assert as_set(listed(glob, None)) == {(ns, b"g", 4)}, "the prefix was read as a pattern"
        assert as_set(listed(plain, None)) == {(ns, b"p:b:x", 5)}


def test_peer_declines_with_the_contract_version() -> None:
    handle = BackendRegistry().create("peer")
    assert not handle.implements("kvtier_scan")
    with pytest.raises(PluginError, match=r"does not implement kvtier_scan \(contract 1\.1\)"):
        handle.scan(None)


class _BadScan:
    """Answers kvtier_scan with entries of the wrong shape."""

    def __init__(self, entries: list[Any]) -> None:
        self.entries = entries

    @hookimpl
    def kvtier_put(self, keys: Any, blocks: Any) -> list[bool]:
        return [True] * len(keys)

    @hookimpl
    def kvtier_get(self, keys: Any) -> list[None]:
        return [None] * len(keys)

    @hookimpl
    def kvtier_lookup(self, keys: Any) -> list[bool]:
        return [False] * len(keys)

    @hookimpl
    def kvtier_evict(self, keys: Any) -> list[bool]:
        return [False] * len(keys)

    @hookimpl
    def kvtier_scan(self, namespace: str | None) -> Iterator[list[Any]]:
        return iter([self.entries])


@pytest.mark.parametrize("entry", [
    ("ns", b"key"),  # too short
    ("ns", "key", 1, None),  # a str key
    ("ns", bytearray(b"key"), 1, None),  # keys are bytes
    ("ns", b"key", -1, None),  # a negative size
    ("ns", b"key", 1, "yesterday"),  # a str time
])
def test_registry_refuses_malformed_entries(entry: Any) -> None:
    registry = BackendRegistry()
    registry.register("bad-scan", lambda: _BadScan([entry]))
    handle = registry.create("bad-scan")
    with pytest.raises(ContractError, match="kvtier_scan entry"):
        list(handle.scan(None))


def test_registry_accepts_plain_tuples() -> None:
    registry = BackendRegistry()
    registry.register("tuple-scan", lambda: _BadScan([("ab" * 16, b"k", 3, 7)]))
    (batch,) = list(registry.create("tuple-scan").scan(None))
    assert batch == [ScanEntry("ab" * 16, b"k", 3, 7.0)]
