"""The ``host`` backend's data path: batches, buffers, capacity accounting, threads at once."""

from __future__ import annotations

import array
import random
import sys
import threading
from collections import Counter

import pytest
from host_blocks import POLICIES, MiB, block, k, open_host, resident

from kvtier.plugins.registry import BackendHandle
from kvtier.spec import BytesLike

# --- data path ----------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 100, 4096, 65537, 8 * MiB])
def test_round_trip_sizes(host: BackendHandle, size: int) -> None:
    key, data = k(size), block(k(size), size)
    evicted: list[tuple[bytes, BytesLike]] = []
    assert list(host.put([key], [bytearray(data)], evicted)) == [True]
    assert evicted == []
    assert bytes(host.get([key])[0] or b"") == data
    out = bytearray(size)
    assert list(host.get_into([key], [[memoryview(out)]])) == [size]
    assert out == data
    # the same block through the gather path, as header + payload
    key2 = k(f"parts-{size}")
    parts: list[BytesLike] = [data[:1], memoryview(data)[1:]]
    assert list(host.put_parts([key2], [parts], evicted)) == [True]
    assert host.get([key2])[0] == data
    assert host.stats()["used_bytes"] == 2 * size


def test_mixed_hit_miss_batch(host: BackendHandle) -> None:
    keys = [k(i) for i in range(6)]
    blocks = {key: block(key, 10 + i) for i, key in enumerate(keys)}
    host.put(keys[::2], [blocks[key] for key in keys[::2]], [])
    got = host.get(keys)
    assert got == [blocks[key] if i % 2 == 0 else None for i, key in enumerate(keys)]
    assert list(host.lookup(keys)) == [i % 2 == 0 for i in range(6)]
    bufs = [[memoryview(bytearray(len(blocks[key])))] for key in keys]
    sizes = host.get_into(keys, bufs)
    assert list(sizes) == [len(blocks[key]) if i % 2 == 0 else None for i, key in enumerate(keys)]
    for i, key in enumerate(keys[::2]):
        assert bytes(bufs[2 * i][0]) == blocks[key]
    assert list(host.evict(keys)) == [i % 2 == 0 for i in range(6)]
    assert host.get(keys) == [None] * 6


def test_duplicate_keys_in_one_batch(host: BackendHandle) -> None:
    first, second = b"first", b"second!"
    assert list(host.put([b"a", b"a"], [first, second], [])) == [True, True]
    assert host.get([b"a", b"a"]) == [first, first]  # immutable per key: first one stays
    assert list(host.put_parts([b"b", b"b"], [[b"x"], [b"y", b"z"]], [])) == [True, True]
    assert host.get([b"b"]) == [b"x"]
    assert list(host.lookup([b"a", b"a"])) == [True, True]
    assert list(host.evict([b"a", b"a"])) == [True, False]
    assert host.stats()["blocks"] == 1 and host.stats()["used_bytes"] == 1


def test_empty_batches(host: BackendHandle) -> None:
    evicted: list[tuple[bytes, BytesLike]] = []
    assert list(host.put([], [], evicted)) == []
    assert list(host.put_parts([], [], evicted)) == []
    assert list(host.get([])) == []
    assert list(host.get_into([], [])) == []
    assert list(host.lookup([])) == []
    assert list(host.evict([])) == []
    assert evicted == []


def test_empty_block_is_a_hit_not_a_miss(host: BackendHandle) -> None:
    assert list(host.put([b"e"], [b""], [])) == [True]
    assert host.get([b"e"]) == [b""]
    assert list(host.lookup([b"e"])) == [True]
    assert list(host.get_into([b"e"], [[]])) == [0]
    assert list(host.evict([b"e"])) == [True]


def test_get_is_zero_copy_for_bytes_and_one_copy_otherwise(host: BackendHandle) -> None:
    data = block(b"z", 4096)
    host.put([b"z"], [data], [])
    assert host.get([b"z"])[0] is data
    source = bytearray(block(b"y", 100))
    host.put([b"y"], [source], [])
    source[:] = bytes(100)  # the caller reuses its buffer after the call
    got = host.get([b"y"])[0]
    assert type(got) is bytes and got == block(b"y", 100)
    assert host.get([b"y"])[0] is got  # get never copies what it stores
    floats = array.array("f", [1.0, 2.0, 3.0])  # a memoryview's len() is items, not bytes
    host.put([b"f"], [memoryview(floats)], [])
    assert host.get([b"f"])[0] == floats.tobytes()
    assert host.stats()["used_bytes"] == 4096 + 100 + 12


def test_put_parts_accepts_mixed_buffers(host: BackendHandle) -> None:
    parts: list[BytesLike] = [bytearray(b"head"), memoryview(b"--payload--")[2:-2], b"tail"]
    assert list(host.put_parts([b"p"], [parts], [])) == [True]
    assert host.get([b"p"]) == [b"headpayloadtail"]


def test_get_into_scatter_exact_and_wrong_size(host: BackendHandle) -> None:
    data = block(b"s", 1000)
    host.put([b"s"], [data], [])
    out = bytearray(1000)
    view = memoryview(out)
    scatter = [view[:10], view[10:10], view[10:600], view[600:]]
    assert list(host.get_into([b"s"], [scatter])) == [1000]
    assert out == data
    for wrong in (999, 1001):
        buf = bytearray(b"\xaa" * wrong)
        assert list(host.get_into([b"s"], [[memoryview(buf)]])) == [1000]
        assert buf == b"\xaa" * wrong  # nothing written on a size mismatch
    wide = array.array("H", bytes(1000))  # a non-byte memoryview is filled by bytes
    assert list(host.get_into([b"s"], [[memoryview(wide)]])) == [1000]
    assert wide.tobytes() == data
    assert list(host.get_into([b"missing"], [[memoryview(bytearray(4))]])) == [None]


def test_put_of_stored_key_keeps_data_and_counts_as_use() -> None:
    handle = open_host(300)
    handle.put([b"a", b"b", b"c"], [b"A" * 100, b"B" * 100, b"C" * 100], [])
    assert list(handle.put([b"a"], [b"X" * 100], [])) == [True]  # a is now most recent
    assert handle.get([b"a"]) == [b"A" * 100]
    evicted: list[tuple[bytes, BytesLike]] = []
    handle.put([b"d"], [b"D" * 100], evicted)
    assert evicted == [(b"b", b"B" * 100)]


def test_lookup_is_not_a_use() -> None:
    handle = open_host(200)
    handle.put([b"a", b"b"], [b"A" * 100, b"B" * 100], [])
    assert list(handle.lookup([b"a"])) == [True]
    evicted: list[tuple[bytes, BytesLike]] = []
    handle.put([b"c"], [b"C" * 100], evicted)
    assert [key for key, _ in evicted] == [b"a"]


@pytest.mark.parametrize("eviction", POLICIES)
def test_oversize_blocks_are_refused_without_evicting(eviction: str) -> None:
    handle = open_host(1000, eviction, max_block_size=600)
    handle.put([b"a", b"b"], [b"a" * 400, b"b" * 400], [])
    evicted: list[tuple[bytes, BytesLike]] = []
    ok = handle.put([b"big", b"huge", b"c"], [b"x" * 601, b"y" * 5000, b"c" * 100], evicted)
    assert list(ok) == [False, False, True]
    assert list(handle.put_parts([b"big2"], [[b"x" * 300, b"y" * 301]], evicted)) == [False]
    assert evicted == []
    assert list(handle.lookup([b"a", b"b", b"c", b"big", b"huge", b"big2"])) == [
        True, True, True, False, False, False,
    ]
    assert list(handle.put([b"max"], [b"m" * 600], evicted)) == [True]
    assert handle.stats()["used_bytes"] <= 1000
    # a block exactly the capacity is accepted and pushes everything else out
    whole = open_host(1000, eviction)
    whole.put([b"a", b"b"], [b"a" * 500, b"b" * 500], [])
    evicted = []
    assert list(whole.put([b"all"], [b"z" * 1000], evicted)) == [True]
    assert sorted(key for key, _ in evicted) == [b"a", b"b"]
    assert whole.stats()["used_bytes"] == 1000


def test_explicit_evict_is_not_reported_or_counted(host: BackendHandle) -> None:
    evicted: list[tuple[bytes, BytesLike]] = []
    host.put([b"a"], [b"aaa"], evicted)
    assert list(host.evict([b"a", b"nope"])) == [True, False]
    assert evicted == []
    assert host.stats()["evictions"] == 0 and host.stats()["used_bytes"] == 0


@pytest.mark.parametrize("eviction", POLICIES)
def test_capacity_never_exceeded_and_evictions_exact(eviction: str) -> None:
    capacity = 20_000
    handle = open_host(capacity, eviction)
    rng = random.Random(7)
    pool = [k(i) for i in range(120)]
    shadow: dict[bytes, bytes] = {}  # bytes of every block stored so far
    total_evicted = 0
    for step in range(300):
        before = resident(handle, pool)
        candidates = [key for key in pool if key not in before]
        keys = rng.sample(candidates, rng.randint(0, 6))
        blocks = {key: block(key, rng.choice([0, 1, 50, 900, 3000, 7000]), step) for key in keys}
        evicted: list[tuple[bytes, BytesLike]] = []
        ok = handle.put(keys, [blocks[key] for key in keys], evicted)
        assert all(ok)
        if rng.random() < 0.5:
            handle.get(rng.sample(pool, 10))
        stats = handle.stats()
        assert stats["used_bytes"] <= capacity
        after = resident(handle, pool)
        disappeared = (before | set(keys)) - after
        assert Counter(key for key, _ in evicted) == Counter(disappeared)
        for key, data in evicted:  # exact bytes of what was pushed out
            assert bytes(data) == (blocks[key] if key in blocks else shadow[key])
        shadow.update(blocks)
        assert stats["blocks"] == len(after)
        assert stats["used_bytes"] == sum(len(shadow[key]) for key in after)
        total_evicted += len(evicted)
    assert total_evicted > 100
    assert handle.stats()["evictions"] == total_evicted


# --- threads ------------------------------------------------------------------------


@pytest.mark.parametrize("eviction", POLICIES)
def test_threads_never_see_wrong_bytes(eviction: str) -> None:
    capacity = 32 * 1024
    handle = open_host(capacity, eviction)
    shared = [k(f"shared-{i}") for i in range(16)]
    everything = shared + [k(f"t{s}-{i}") for s in range(4) for i in range(16)]
    # content-addressed, so any thread's put of a key stores the same bytes
    content = {key: block(key, 100 + sum(key) * 37 % 3000) for key in everything}
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        mine = [k(f"t{seed}-{i}") for i in range(16)]
        try:
            for _ in range(3000):
                keys = rng.sample(mine + shared, rng.randint(1, 4))
                op = rng.random()
                if op < 0.4:
                    evicted: list[tuple[bytes, BytesLike]] = []
                    blocks = [bytearray(content[key]) if op < 0.1 else content[key] for key in keys]
                    assert all(handle.put(keys, blocks, evicted))
                    for key, data in evicted:
                        assert bytes(data) == content[key]
                elif op < 0.7:
                    for key, got in zip(keys, handle.get(keys), strict=True):
                        assert got is None or got == content[key]
                elif op < 0.85:
                    bufs = [bytearray(len(content[key])) for key in keys]
                    sizes = handle.get_into(keys, [[memoryview(b)] for b in bufs])
                    for key, size, buf in zip(keys, sizes, bufs, strict=True):
                        assert size is None or (size == len(buf) and buf == content[key])
                else:
                    handle.evict(keys)
        except BaseException as exc:
            errors.append(exc)

    def monitor() -> None:
        last = 0
        try:
            while not stop.is_set():
                stats = handle.stats()
                assert 0 <= stats["used_bytes"] <= capacity
                assert stats["evictions"] >= last
                last = int(stats["evictions"])
        except BaseException as exc:
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
        watcher = threading.Thread(target=monitor)
        watcher.start()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        stop.set()
        watcher.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
    held = [key for key in everything if key in resident(handle, everything)]
    assert handle.get(held) == [content[key] for key in held]
    stats = handle.stats()
    assert stats["blocks"] == len(held)
    assert stats["used_bytes"] == sum(len(content[key]) for key in held) <= capacity
    assert stats["evictions"] > 0
