"""The ``fs`` backend on ``s3://`` through s3fs, against a real S3 server (SeaweedFS)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from seaweed import SeaweedServer
from writer_process import put_in_another_process

from kvtier import Namespace, open_chain
from kvtier.plugins.registry import BackendHandle, default_registry
from kvtier.spec import BackendError

pytest.importorskip("s3fs")

NS = "0123456789abcdef0123456789abcdef"


def blob(size: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + size).randbytes(size)


def key(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"fs3"


def options(server: SeaweedServer, bucket: str, **over: Any) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "url": f"s3://{bucket}/kv/cache",
        "capacity": None,
        "fsync": False,
        "io_threads": 4,
        "storage_options": {
            "key": server.access_key,
            "secret": server.secret_key,
            "endpoint_url": server.endpoint,
            "client_kwargs": {"region_name": server.region},
            # every open is a new client: a cached one would carry its listings
            "skip_instance_cache": True,
        },
    }
    opts.update(over)
    return opts


def opened(opts: dict[str, Any]) -> BackendHandle:
    handle = default_registry().create("fs")
    handle.open(opts, NS)
    return handle


def test_round_trips_and_lookups(s3_server: SeaweedServer, bucket: str) -> None:
    store = opened(options(s3_server, bucket))
    try:
        sizes = [1, 4096, 65_537, 1 << 20]
        keys = [key(i) for i in range(len(sizes))]
        blocks = [blob(n, i) for i, n in enumerate(sizes)]
        assert store.put(keys, blocks, []) == [True] * len(keys)
        got = store.get([*keys, key(99)])
        assert [None if b is None else bytes(b) for b in got] == [*blocks, None]
        assert list(store.lookup([key(0), key(99)])) == [True, False]
        outs = [memoryview(bytearray(n)) for n in sizes]
        assert list(store.get_into(keys, [[o] for o in outs])) == sizes
        assert [bytes(o) for o in outs] == blocks
        assert list(store.evict([key(0), key(99)])) == [True, False]
        assert store.get([key(0)]) == [None]
    finally:
        store.close()


def test_blocks_survive_a_restart(s3_server: SeaweedServer, bucket: str) -> None:
    """Written by another process, found by a new instance (index rebuilt from a LIST)."""
    opts = options(s3_server, bucket, capacity="1MiB")
    put_in_another_process("fs", opts, NS, [key(i) for i in range(5)],
                           [blob(3000, i) for i in range(5)])
    store = opened(opts)
    try:
        assert store.capabilities().persistent
        assert store.stats()["blocks"] == 5 and store.stats()["used_bytes"] == 5 * 3000
        got = store.get([key(i) for i in range(5)])
        assert [bytes(b) for b in got if b is not None] == [blob(3000, i) for i in range(5)]
    finally:
        store.close()


def test_chain_with_fs_on_s3(s3_server: SeaweedServer, bucket: str) -> None:
    tier = {"name": "s3", "backend": "fs", **options(s3_server, bucket)}
    ns = Namespace("fs-on-s3", dtype="bfloat16", tokens_per_block=32)
    with open_chain({"chain": [tier]}, namespace=ns) as chain:
        assert chain.put([key(1)], [blob(4096, 1)]) == [True]
    with open_chain({"chain": [tier]}, namespace=ns) as chain:
        out = bytearray(4096)
        assert chain.get([key(1)], [out]) == [True] and bytes(out) == blob(4096, 1)


def test_wrong_secret_fails_at_open_without_showing_it(
    s3_server: SeaweedServer, bucket: str
) -> None:
    opts = options(s3_server, bucket)
    opts["storage_options"] = {**opts["storage_options"], "secret": "wrong-secret-value"}
    with pytest.raises(BackendError) as info:
        opened(opts)
    assert "wrong-secret-value" not in str(info.value)
    assert bucket in str(info.value)


def test_missing_bucket_fails_at_open_and_is_not_created(s3_server: SeaweedServer) -> None:
    import s3fs

    name = "kvt-fs-missing-bucket"
    opts = options(s3_server, name)
    fs = s3fs.S3FileSystem(**opts["storage_options"])
    try:
        with pytest.raises(BackendError, match=name):
            opened(opts).close()
        assert not fs.exists(name)  # a misspelt bucket must not become a new one
    finally:
        if fs.exists(name):
            fs.rm(name, recursive=True)
