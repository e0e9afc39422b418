"""The ``object`` backend against a real S3 server (SeaweedFS, see ``tests/support/seaweed.py``)."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from seaweed import SeaweedServer
from writer_process import put_in_another_process

import kvtier
import kvtier.chain.health
from kvtier import Namespace, open_chain
from kvtier.backends import object as object_module
from kvtier.backends.object import ObjectBackend
from kvtier.plugins.registry import BackendHandle, BackendRegistry
from kvtier.spec import BackendError, ClosedError, ConfigError

NS = "0123456789abcdef0123456789abcdef"
CHAIN_NS = Namespace("object-test", dtype="bfloat16", tokens_per_block=32)
Opener = Callable[..., BackendHandle]


def blob(size: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + size).randbytes(size)


def key(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"obj"


def registry() -> BackendRegistry:
    return BackendRegistry()  # object and host through their entry points


def options(server: SeaweedServer, bucket: str, **over: Any) -> dict[str, Any]:
    # what the config loader would pass: every option, defaults filled
    opts: dict[str, Any] = {k: o.default for k, o in ObjectBackend().kvtier_options().items()}
    opts.update(
        bucket=bucket,
        endpoint=server.endpoint,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
        region=server.region,
    )
    opts.update(over)
    return opts


@pytest.fixture
def open_backend(s3_server: SeaweedServer, bucket: str) -> Iterator[Opener]:
    """Opens backends on ``bucket``; closes them all at the end."""
    handles: list[BackendHandle] = []

    def opener(namespace: str = NS, **over: Any) -> BackendHandle:
        handle = registry().create("object")
        handle.open(options(s3_server, bucket, **over), namespace)
        handles.append(handle)
        return handle

    yield opener
    for handle in handles:
        handle.close()


def as_bytes(blocks: Any) -> list[bytes | None]:
    return [None if b is None else bytes(b) for b in blocks]


# --- data path ------------------------------------------------------------------------


def test_round_trips_byte_for_byte(open_backend: Opener) -> None:
    store = open_backend()
    sizes = [1, 2, 100, 4096, 65_537, 1 << 20, 8 << 20]
    keys = [key(i) for i in range(len(sizes))]
    blocks = [blob(n, i) for i, n in enumerate(sizes)]
    assert store.put(keys, blocks, []) == [True] * len(keys)
    assert as_bytes(store.get(keys)) == blocks
    # a fresh instance has no cache to help it
    assert as_bytes(open_backend().get(list(reversed(keys)))) == list(reversed(blocks))


def test_keys_of_any_length_and_memoryview_blocks(open_backend: Opener) -> None:
    store = open_backend()
    keys = [b"\x00", b"\xff" * 64, b"k" * 33]
    blocks = [memoryview(bytearray(blob(10, i))) for i in range(3)]
    assert store.put(keys, blocks, []) == [True] * 3
    assert as_bytes(store.get(keys)) == [bytes(b) for b in blocks]


def test_mixed_hits_and_misses(open_backend: Opener) -> None:
    store = open_backend()
    store.put([key(1), key(3)], [blob(10, 1), blob(20, 3)], [])
    keys = [key(0), key(1), key(2), key(3), key(4)]
    assert as_bytes(store.get(keys)) == [None, blob(10, 1), None, blob(20, 3), None]
    assert list(store.lookup(keys)) == [False, True, False, True, False]
    assert list(open_backend(lookup_cache_ttl=0).lookup(keys)) == [False, True, False, True, False]


def test_duplicate_keys_in_one_batch(open_backend: Opener) -> None:
    store = open_backend()
    assert store.put([key(1), key(1), key(2)], [blob(5, 1), blob(5, 1), blob(5, 2)], []) == [
        True,
        True,
        True,
    ]
    assert store.stats()["uploads"] == 2
    got = as_bytes(store.get([key(1), key(2), key(1), key(9), key(9)]))
    assert got == [blob(5, 1), blob(5, 2), blob(5, 1), None, None]
    assert list(store.lookup([key(2), key(2), key(9)])) == [True, True, False]
    # a repeated key is removed by its first mention
    assert list(store.evict([key(1), key(1), key(9)])) == [True, False, False]


def test_empty_batches(open_backend: Opener) -> None:
    store = open_backend()
    assert list(store.put([], [], [])) == []
    assert list(store.get([])) == []
    assert list(store.lookup([])) == []
    assert list(store.evict([])) == []


def test_second_put_of_a_key_is_not_uploaded(open_backend: Opener) -> None:
    """Conditional create: the tampered bytes survive a second put of the original."""
    store = open_backend()
    original = blob(1000, 7)
    assert store.put([key(7)], [original], []) == [True]
    assert store.tamper(key(7), lambda b: b[::-1])
    assert store.put([key(7)], [original], []) == [True]  # already stored counts as stored
    assert as_bytes(store.get([key(7)])) == [original[::-1]]
    # another instance skips it the same way
    assert open_backend().put([key(7)], [original], []) == [True]
    assert as_bytes(store.get([key(7)])) == [original[::-1]]
    stats = store.stats()
    assert (stats["uploads"], stats["already_stored"]) == (1, 1)
    assert store.tamper(key(8), lambda b: b) is False


def test_lookup_cache_answers_within_its_ttl(open_backend: Opener) -> None:
    writer = open_backend(lookup_cache_ttl=0)
    cached = open_backend(lookup_cache_ttl="1h")  # never expires during the test
    short = open_backend(lookup_cache_ttl="200ms")
    assert list(cached.lookup([key(1)])) == [False]
    assert list(short.lookup([key(1)])) == [False]
    writer.put([key(1)], [blob(10, 1)], [])
    # the negative entry is stale, but get is the authority and refreshes it
    assert list(cached.lookup([key(1)])) == [False]
    assert as_bytes(cached.get([key(1)])) == [blob(10, 1)]
    assert list(cached.lookup([key(1)])) == [True]
    deadline = time.monotonic() + 10
    while short.lookup([key(1)]) != [True] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(short.lookup([key(1)])) == [True]
    # a put or evict by the instance itself updates its cache at once
    heads = cached.stats()["heads"]
    cached.put([key(2)], [blob(10, 2)], [])
    assert list(cached.lookup([key(2)])) == [True]
    assert cached.evict([key(2)]) == [True]
    assert list(cached.lookup([key(2)])) == [False]
    assert cached.stats()["heads"] == heads + 1  # the evict asked, the lookups did not
    # the cache off: every lookup asks the server
    assert list(writer.lookup([key(1), key(2)])) == [True, False]


def test_evict(open_backend: Opener) -> None:
    store = open_backend()
    store.put([key(1), key(2)], [blob(10, 1), blob(10, 2)], [])
    assert list(store.evict([key(1), key(3)])) == [True, False]
    assert as_bytes(store.get([key(1), key(2)])) == [None, blob(10, 2)]
    assert list(open_backend(lookup_cache_ttl=0).lookup([key(1), key(2)])) == [False, True]
    assert list(store.evict([key(1)])) == [False]


def test_namespaces_and_prefixes_are_separate(open_backend: Opener) -> None:
    open_backend(prefix="a/b").put([key(1)], [blob(10, 1)], [])
    assert as_bytes(open_backend(prefix="a").get([key(1)])) == [None]
    assert as_bytes(open_backend(prefix="/a/b/").get([key(1)])) == [blob(10, 1)]
    assert as_bytes(open_backend("f" * 32, prefix="a/b").get([key(1)])) == [None]


def test_capacity_deletes_the_oldest(open_backend: Opener) -> None:
    store = open_backend(capacity=3000)
    for i in range(5):
        assert store.put([key(i)], [blob(1000, i)], []) == [True]
        assert store.stats()["used_bytes"] <= 3000
    assert store.put([key(9)], [blob(3001, 9)], []) == [False]  # larger than the capacity
    fresh = open_backend(lookup_cache_ttl=0)
    assert list(fresh.lookup([key(i) for i in range(5)] + [key(9)])) == [
        False,
        False,
        True,
        True,
        True,
        False,
    ]
    stats = store.stats()
    assert (stats["used_bytes"], stats["blocks"], stats["capacity_bytes"]) == (3000, 3, 3000)
    # a new instance rebuilds the figures from a LIST of its namespace
    again = open_backend(capacity=3000)
    assert (again.stats()["used_bytes"], again.stats()["blocks"]) == (3000, 3)
    # and enforces a smaller capacity at once
    smaller = open_backend(capacity=1500)
    assert (smaller.stats()["used_bytes"], smaller.stats()["blocks"]) == (1000, 1)
    assert sum(fresh.lookup([key(i) for i in range(5)])) == 1
    assert smaller.capabilities().capacity == 1500


def test_max_age_deletes_old_blocks(open_backend: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = open_backend(lookup_cache_ttl=0)
    writer.put([key(1), key(2)], [blob(10, 1), blob(10, 2)], [])
    time.sleep(3.2)  # last-modified times have a resolution of one second
    aged = open_backend(max_age="2s", lookup_cache_ttl=0)  # a cleanup pass at open
    assert list(writer.lookup([key(1), key(2)])) == [False, False]
    assert aged.stats()["deleted"] == 2
    # during puts, at most once per CLEANUP_INTERVAL, in the background
    monkeypatch.setattr(object_module, "CLEANUP_INTERVAL", 0.0)
    writer.put([key(3)], [blob(10, 3)], [])
    time.sleep(3.2)
    aged.put([key(4)], [blob(10, 4)], [])  # starts one pass; key 3 is too old by now
    deadline = time.monotonic() + 20
    while writer.lookup([key(3)]) != [False] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(writer.lookup([key(3), key(4)])) == [False, True]


# --- lifecycle, persistence, sharing --------------------------------------------------


def test_blocks_survive_the_process(s3_server: SeaweedServer, bucket: str) -> None:
    opts = options(s3_server, bucket)
    put_in_another_process("object", opts, NS, [key(i) for i in range(6)],
                           [blob(5000, i) for i in range(6)])
    handle = registry().create("object")
    handle.open(opts, NS)
    try:
        assert handle.capabilities().persistent
        assert as_bytes(handle.get([key(i) for i in range(6)])) == [blob(5000, i) for i in range(6)]
    finally:
        handle.close()


def test_two_chains_on_one_bucket_share_blocks(s3_server: SeaweedServer, bucket: str) -> None:
    tier = {"name": "s3", "backend": "object", **options(s3_server, bucket)}
    cfg = {"chain": [tier]}
    reg = registry()
    with (
        open_chain(cfg, namespace=CHAIN_NS, registry=reg) as one,
        open_chain(cfg, namespace=CHAIN_NS, registry=reg) as two,
    ):
        assert one.tiers[0].capabilities.shared
        assert one.put([key(1)], [blob(4096, 1)]) == [True]
        assert two.put([key(2)], [blob(4096, 2)]) == [True]
        for chain in (one, two):
            out = [bytearray(4096), bytearray(4096)]
            assert chain.get([key(1), key(2)], out) == [True, True]
            assert [bytes(o) for o in out] == [blob(4096, 1), blob(4096, 2)]
        assert two.evict([key(1)]) == 1
        assert one.get([key(1)], [bytearray(4096)]) == [False]


def test_closed_backend_refuses_calls(open_backend: Opener) -> None:
    store = open_backend()
    store.close()
    store.close()  # idempotent
    for call in (
        lambda: store.put([key(1)], [b"x"], []),
        lambda: store.get([key(1)]),
        lambda: store.lookup([key(1)]),
        lambda: store.evict([key(1)]),
        store.stats,
    ):
        with pytest.raises(ClosedError):
            call()


# --- configuration and faults ---------------------------------------------------------


def test_wrong_credentials_fail_at_open(s3_server: SeaweedServer, bucket: str) -> None:
    wrong = "not-the-secret-" + s3_server.secret_key[:6]
    handle = registry().create("object")
    with pytest.raises(BackendError) as info:
        handle.open(options(s3_server, bucket, secret_access_key=wrong), NS)
    message = str(info.value)
    assert "refused the credentials" in message
    assert s3_server.endpoint in message and bucket in message
    assert wrong not in message and s3_server.secret_key not in message
    unknown = options(s3_server, bucket, access_key_id="nobody", secret_access_key=wrong)
    with pytest.raises(BackendError, match="refused the credentials"):
        registry().create("object").open(unknown, NS)
    cfg = {"chain": [{"name": "s3", "backend": "object", "required": True, **unknown}]}
    with pytest.raises(BackendError, match="refused the credentials"):
        open_chain(cfg, namespace=CHAIN_NS, registry=registry())


def test_no_credentials_says_none_were_found(
    s3_server: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    # the instance metadata service obstore asks next: one on a port that refuses,
    # so that the test means the same on a cloud machine that has one
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{port}")
    none = options(s3_server, bucket, access_key_id=None, secret_access_key=None)
    with pytest.raises(BackendError) as info:
        registry().create("object").open(none, NS)
    message = str(info.value)
    assert "no credentials found" in message and "refused the credentials" not in message
    assert bucket in message and s3_server.endpoint in message
    assert "access_key_id" in message and "AWS_ACCESS_KEY_ID" in message


def test_missing_bucket_is_named(s3_server: SeaweedServer) -> None:
    handle = registry().create("object")
    with pytest.raises(BackendError, match="bucket 'kvt-no-such-bucket' does not exist") as info:
        handle.open(options(s3_server, "kvt-no-such-bucket"), NS)
    assert s3_server.endpoint in str(info.value)


def test_bad_options_are_config_errors(s3_server: SeaweedServer, bucket: str) -> None:
    for over in ({"prefix": "a/../b"}, {"concurrency": 0}, {"lookup_cache_ttl": "soon"}):
        with pytest.raises(ConfigError):
            registry().create("object").open(options(s3_server, bucket, **over), NS)
    with pytest.raises(ConfigError, match="namespace"):
        registry().create("object").open(options(s3_server, bucket), "../x")
    with pytest.raises(ConfigError, match="bucket"):
        kvtier.open_chain(
            {"chain": [{"name": "s3", "backend": "object"}]}, "m", registry=registry()
        )


def test_unreachable_server_is_a_backend_error(s3_server: SeaweedServer, bucket: str) -> None:
    closed_port = options(s3_server, bucket, endpoint="http://127.0.0.1:9", connect_timeout="1s")
    with pytest.raises(BackendError, match=r"127\.0\.0\.1:9"):
        registry().create("object").open(closed_port, NS)


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[SeaweedServer]:
    """A server of the test's own, to kill without disturbing the others."""
    server = SeaweedServer(tmp_path / "seaweedfs")
    server.start()
    yield server
    server.kill()  # its data is thrown away: no need to wait for a clean shutdown


def test_chain_survives_the_server_dying_and_recovers(
    own_server: SeaweedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kvtier.chain.health, "_BACKOFF_FIRST", 0.05)
    bucket = own_server.make_bucket("kvt-faults")
    cfg = {
        "chain": [
            {"name": "ram", "backend": "host", "capacity": 4 * 4096 + 2000},
            {
                "name": "s3",
                "backend": "object",
                "write": "through",
                **options(own_server, bucket, lookup_cache_ttl=0, request_timeout="5s"),
            },
        ]
    }
    size = 4096
    with open_chain(cfg, namespace=CHAIN_NS, registry=registry()) as chain:
        assert (
            chain.put([key(i) for i in range(8)], [blob(size, i) for i in range(8)]) == [True] * 8
        )
        chain.flush()
        assert chain.lookup([key(0), key(7)]) == [1, 0]  # 0-3 only in S3 now

        own_server.kill()
        seen_unhealthy = False
        for i in range(100, 106):
            assert chain.put([key(i)], [blob(size, i)]) == [True]  # RAM takes it
            chain.flush()  # the write through to S3 fails, quietly
            # RAM still answers; what only S3 had is a miss, never an exception
            out = [bytearray(size) for _ in range(2)]
            assert chain.get([key(i), key(0)], out) == [True, False]
            assert bytes(out[0]) == blob(size, i)
            seen_unhealthy |= not chain.stats()["tiers"][1]["healthy"]
        s3 = chain.stats()["tiers"][1]
        assert s3["errors"] >= 1 and seen_unhealthy
        assert bucket in s3["last_error"] and own_server.secret_key not in s3["last_error"]

        own_server.start()  # same ports, same data
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            flags, _, _ = chain.tiers[1].put_payloads([key(200)], [blob(size, 200)])
            if flags == [True]:
                break
            time.sleep(0.05)
        assert flags == [True]
        assert chain.stats()["tiers"][1]["healthy"]
        out = [bytearray(size) for _ in range(4)]
        assert chain.get([key(i) for i in range(4)], out) == [True] * 4  # written before the kill
        assert [bytes(o) for o in out] == [blob(size, i) for i in range(4)]
