"""``object``'s ``kvtier_get_into`` against a real SeaweedFS: objects read straight into
the caller's buffers, and a chain's scatter reads through it (checked as each run lands)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from seaweed import SeaweedServer, object_options

from kvtier import Namespace, open_chain
from kvtier.backends.object import ObjectBackend
from kvtier.plugins.registry import BackendHandle, BackendRegistry

NS = "fedcba9876543210fedcba9876543210"
CHAIN_NS = Namespace("object-get-into", dtype="float32", tokens_per_block=32)
MIB = 1 << 20


def blob(size: int, seed: int) -> bytes:
    return random.Random(seed * 7919 + size).randbytes(size)


def key(i: int) -> bytes:
    return b"into-%04d" % i


@pytest.fixture(params=[True, False], ids=["socket-reads", "obstore-reads"])
def store(s3_server: SeaweedServer, bucket: str,
          request: pytest.FixtureRequest) -> Iterator[BackendHandle]:
    """The backend, its bodies received by its own sockets or by obstore (``socket_reads``)."""
    handle = BackendRegistry().create("object")
    handle.open(object_options(s3_server, bucket, socket_reads=request.param), NS)
    yield handle
    handle.close()


def tamper(handle: BackendHandle, k: bytes, transform: Any) -> None:
    backend = handle.instance
    assert isinstance(backend, ObjectBackend)
    assert backend.kit_tamper(k, transform)


def test_reads_straight_into_scatter_lists_byte_for_byte(store: BackendHandle) -> None:
    assert store.implements("kvtier_get_into")
    sizes = [1, 4096, 3 * MIB + 17]
    keys = [key(i) for i in range(3)]
    blocks = [blob(n, i) for i, n in enumerate(sizes)]
    assert store.put(keys, blocks, []) == [True] * 3
    outs = [bytearray(n) for n in sizes]
    # the large one split at odd places, so chunks of the body straddle the buffers
    big = memoryview(outs[2])
    scatter = [[memoryview(outs[0])], [memoryview(outs[1])],
               [big[:5], big[5 : MIB + 3], big[MIB + 3 : MIB + 3], big[MIB + 3 :]]]
    assert store.get_into(keys, scatter) == sizes
    assert [bytes(o) for o in outs] == blocks


def test_missing_and_truncated_objects_are_misses(store: BackendHandle) -> None:
    keys = [key(10), key(11), key(12)]
    blocks = [blob(2 * MIB, i) for i in range(3)]
    assert store.put(keys[:2], blocks[:2], []) == [True, True]
    tamper(store, keys[1], lambda old: old[: len(old) - 1])
    outs = [bytearray(2 * MIB) for _ in keys]
    sizes = store.get_into(keys, [[memoryview(o)] for o in outs])
    # the truncated object answers its own size, which the caller's buffers do not have
    assert sizes == [2 * MIB, 2 * MIB - 1, None]
    assert bytes(outs[0]) == blocks[0]


def test_a_chain_reads_runs_through_get_into_and_misses_a_truncated_block(
    s3_server: SeaweedServer, bucket: str
) -> None:
    options = object_options(s3_server, bucket)
    del options["allow_http"]  # derived from the endpoint in a chain's settings
    tier = {"name": "s3", "backend": "object", **options}
    keys = [key(100 + i) for i in range(12)]  # 24 MiB: several runs in flight
    payloads = [blob(2 * MIB, 100 + i) for i in range(12)]
    with open_chain({"chain": [tier]}, namespace=CHAIN_NS) as chain:
        assert chain.put(keys, payloads) == [True] * 12
        handle = chain.tiers[0].handle
        calls: list[int] = []
        original = handle.get_into

        def counted(ks: Any, bufs: Any) -> Any:
            calls.append(len(ks))
            return original(ks, bufs)

        handle.get_into = counted  # type: ignore[method-assign]
        for k in (keys[3], keys[7]):  # one short by a byte, one with a payload byte flipped
            if k == keys[3]:
                tamper(handle, k, lambda old: old[:-1])
            else:
                tamper(handle, k, lambda old: old[:-9] + bytes([old[-9] ^ 1]) + old[-8:])
        outs = [bytearray(2 * MIB) for _ in keys]
        found = chain.get(keys, outs)
        assert found == [i not in (3, 7) for i in range(12)]
        for i, (out, want) in enumerate(zip(outs, payloads)):
            if found[i]:
                assert bytes(out) == want
        assert len(calls) > 1 and sum(calls) == 12  # the batch went out in runs


def test_an_expired_object_is_a_miss_and_deleted(s3_server: SeaweedServer, bucket: str) -> None:
    opts = object_options(s3_server, bucket, lookup_cache_ttl=0)
    writer, aged = BackendRegistry().create("object"), BackendRegistry().create("object")
    writer.open(opts, NS)
    aged.open({**opts, "expire": "2s"}, NS)  # its pass at open found nothing to delete
    try:
        assert writer.put([key(20), key(21)], [blob(100, 20), blob(100, 21)], []) == [True] * 2
        time.sleep(3.2)  # last-modified times have a resolution of one second
        assert list(writer.lookup([key(20), key(21)])) == [True, True], aged.stats()
        outs = [bytearray(100), bytearray(100)]
        assert aged.get_into([key(20)], [[memoryview(outs[0])]]) == [None]
        assert writer.get_into([key(21)], [[memoryview(outs[1])]]) == [100]  # no expire
        assert bytes(outs[1]) == blob(100, 21)
        assert list(writer.lookup([key(20)])) == [False]  # the read deleted it
    finally:
        writer.close()
        aged.close()


def test_a_chain_misses_a_long_block_and_another_keys_block(
    s3_server: SeaweedServer, bucket: str
) -> None:
    options = object_options(s3_server, bucket)
    del options["allow_http"]
    tier = {"name": "s3", "backend": "object", **options}
    keys = [key(200 + i) for i in range(6)]
    payloads = [blob(2 * MIB, 200 + i) for i in range(6)]
    with open_chain({"chain": [tier]}, namespace=CHAIN_NS) as chain:
        assert chain.put(keys, payloads) == [True] * 6
        handle = chain.tiers[0].handle
        held: list[bytes] = []
        tamper(handle, keys[0], lambda old: held.append(old) or old)  # rewritten as it was
        stored = held[0]
        tamper(handle, keys[2], lambda old: old + b"\0")  # long by a byte
        tamper(handle, keys[4], lambda old: stored)  # another key's block, of the same size
        # the backend answers the long object's own size, which the buffers do not have
        head = bytearray(len(stored) - 2 * MIB)
        assert handle.get_into([keys[2]], [[memoryview(head), memoryview(bytearray(2 * MIB))]]
                               ) == [len(stored) + 1]
        outs = [bytearray(2 * MIB) for _ in keys]
        found = chain.get(keys, outs)  # each a miss, dropped as damaged
        assert found == [i not in (2, 4) for i in range(6)]
        for i in (0, 1, 3, 5):
            assert bytes(outs[i]) == payloads[i]
        assert chain.stats()["tiers"][0]["corrupt"] == 2
