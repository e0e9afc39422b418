"""The ``fs`` backend's data path, on a local directory and on ``memory://``: sizes, batches,
gather and scatter, short transfers, option checks, and four threads at once."""

from __future__ import annotations

import array
import os
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
from fs_blocks import NS, Opener, as_bytes, blob, files_under, options
from worker_threads import run_workers

from kvtier.plugins.registry import default_registry
from kvtier.spec import BytesLike, ConfigError

# ---------------------------------------------------------------------------
# the data path
# ---------------------------------------------------------------------------

SIZES = [1, 2, 100, 4095, 4096, 4097, 65537, 1 << 20, (8 << 20) - 3, 8 << 20]


def test_round_trip_sizes(url: str, opener: Opener) -> None:
    tier = opener(url)
    keys = [f"size-{n}".encode() for n in SIZES]
    blocks = [blob(n) for n in SIZES]
    evicted: list[tuple[bytes, BytesLike]] = []
    assert list(tier.put(keys, blocks, evicted)) == [True] * len(keys)
    assert evicted == []
    assert [as_bytes(b) for b in tier.get(keys)] == blocks
    # one at a time too (the inline path, no thread pool)
    for key, data in zip(keys, blocks, strict=True):
        assert as_bytes(tier.get([key])[0]) == data
    stats = tier.stats()
    assert stats["used_bytes"] == sum(SIZES)
    assert stats["blocks"] == len(SIZES)


def test_mixed_hits_and_misses(url: str, opener: Opener) -> None:
    tier = opener(url)
    stored = {f"k{i}".encode(): blob(1000 + i, i) for i in range(0, 10, 2)}
    assert all(tier.put(list(stored), list(stored.values()), []))
    keys = [f"k{i}".encode() for i in range(10)]
    got = tier.get(keys)
    assert [as_bytes(g) for g in got] == [stored.get(k) for k in keys]
    assert list(tier.lookup(keys)) == [k in stored for k in keys]
    buffers = [[memoryview(bytearray(len(stored.get(k, b"x"))))] for k in keys]
    sizes = tier.get_into(keys, buffers)
    assert list(sizes) == [len(stored[k]) if k in stored else None for k in keys]
    for key, bufs in zip(keys, buffers, strict=True):
        if key in stored:
            assert bytes(bufs[0]) == stored[key]
    assert list(tier.evict(keys)) == [k in stored for k in keys]
    assert list(tier.lookup(keys)) == [False] * 10
    assert tier.stats()["used_bytes"] == 0


def test_duplicate_keys_in_a_batch(url: str, opener: Opener) -> None:
    tier = opener(url)
    data = blob(5000)
    assert list(tier.put([b"dup", b"dup"], [data, data], [])) == [True, True]
    assert tier.stats()["blocks"] == 1
    assert tier.stats()["used_bytes"] == 5000
    assert [as_bytes(g) for g in tier.get([b"dup", b"dup"])] == [data, data]
    bufs = [[memoryview(bytearray(5000))], [memoryview(bytearray(5000))]]
    assert list(tier.get_into([b"dup", b"dup"], bufs)) == [5000, 5000]
    assert bytes(bufs[0][0]) == bytes(bufs[1][0]) == data
    assert list(tier.lookup([b"dup", b"dup"])) == [True, True]
    # storing again is a no-op that still answers True
    assert list(tier.put([b"dup"], [data], [])) == [True]
    assert list(tier.evict([b"dup", b"dup"])) == [True, False]
    assert tier.get([b"dup"]) == [None]


def test_empty_batches(url: str, opener: Opener) -> None:
    tier = opener(url)
    evicted: list[tuple[bytes, BytesLike]] = []
    assert list(tier.put([], [], evicted)) == []
    assert list(tier.put_parts([], [], evicted)) == []
    assert list(tier.get([])) == []
    assert list(tier.get_into([], [])) == []
    assert list(tier.lookup([])) == []
    assert list(tier.evict([])) == []
    assert evicted == []


def test_empty_block(url: str, opener: Opener) -> None:
    tier = opener(url)
    assert list(tier.put([b"empty"], [b""], [])) == [True]
    assert [as_bytes(g) for g in tier.get([b"empty"])] == [b""]
    assert list(tier.get_into([b"empty"], [[]])) == [0]
    assert list(tier.lookup([b"empty"])) == [True]


def test_put_parts_and_get_into_match_put_and_get(url: str, opener: Opener) -> None:
    tier = opener(url)
    header = b"HDR!" * 8
    payloads = [blob(n, 7) for n in (0, 1, 4096, 1 << 20)]
    keys = [f"parts-{i}".encode() for i in range(len(payloads))]
    # a mix of bytes, bytearray and a non-byte-format memoryview as parts
    wide = array.array("H", range(1000))
    parts: list[list[BytesLike]] = [[header, p, memoryview(wide)] for p in payloads]
    joined = [header + p + wide.tobytes() for p in payloads]
    assert tier.implements("kvtier_put_parts") and tier.implements("kvtier_get_into")
    assert list(tier.put_parts(keys, parts, [])) == [True] * len(keys)
    assert [as_bytes(g) for g in tier.get(keys)] == joined

    plain_keys = [f"plain-{i}".encode() for i in range(len(payloads))]
    assert all(tier.put(plain_keys, [bytearray(j) for j in joined], []))
    for key, expect in zip(keys + plain_keys, joined + joined, strict=True):
        # scatter into three buffers split at odd places
        out = bytearray(len(expect))
        view = memoryview(out)
        cut1, cut2 = min(5, len(out)), max(min(5, len(out)), len(out) - 3)
        bufs = [view[:cut1], view[cut1:cut2], view[cut2:]]
        assert list(tier.get_into([key], [bufs])) == [len(expect)]
        assert bytes(out) == expect
    # a batch of get_into over the pool fills every scatter list in place
    outs = [bytearray(len(j)) for j in joined]
    sizes = tier.get_into(keys, [[memoryview(o)] for o in outs])
    assert list(sizes) == [len(j) for j in joined]
    assert [bytes(o) for o in outs] == joined


def test_get_into_wrong_size_reports_stored_size(url: str, opener: Opener) -> None:
    tier = opener(url)
    data = blob(10_000)
    assert all(tier.put([b"k"], [data], []))
    for size in (9_999, 10_001, 0, 1):
        assert list(tier.get_into([b"k"], [[memoryview(bytearray(size))]])) == [10_000]
    # the block is untouched and still readable
    assert as_bytes(tier.get([b"k"])[0]) == data


def test_blocks_returned_and_evicted_stay_valid(url: str, opener: Opener) -> None:
    tier = opener(url, capacity=3000)
    source = bytearray(blob(2000))
    assert all(tier.put([b"a"], [memoryview(source)], []))
    source[:] = b"\0" * 2000  # the caller reuses its buffer after the call
    got = tier.get([b"a"])[0]
    assert as_bytes(got) == blob(2000)
    evicted: list[tuple[bytes, BytesLike]] = []
    assert all(tier.put([b"b"], [blob(2000, 1)], evicted))
    assert [(k, bytes(v)) for k, v in evicted] == [(b"a", blob(2000))]
    assert as_bytes(got) == blob(2000)


def test_many_parts_and_short_transfers(
    url: str, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = opener(url)
    # more buffers than one writev/preadv takes (IOV_MAX is 1024 on Linux)
    chunks = [blob(100, i) for i in range(1500)]
    assert all(tier.put_parts([b"many"], [chunks], []))
    out = [bytearray(100) for _ in range(1500)]
    assert list(tier.get_into([b"many"], [[memoryview(o) for o in out]])) == [150_000]
    assert out == chunks

    # the kernel may move fewer bytes than asked: the rest must follow
    real_writev, real_preadv = os.writev, os.preadv

    def short_writev(fd: int, buffers: Any) -> int:
        return real_writev(fd, [memoryview(buffers[0])[:777]])

    def short_preadv(fd: int, buffers: Any, offset: int) -> int:
        return real_preadv(fd, [memoryview(buffers[0])[:333]], offset)

    monkeypatch.setattr(os, "writev", short_writev)
    monkeypatch.setattr(os, "preadv", short_preadv)
    data = blob(10_000, 3)
    assert all(tier.put_parts([b"short"], [[data[:10], data[10:]]], []))
    target = bytearray(10_000)
    view = memoryview(target)
    assert list(tier.get_into([b"short"], [[view[:5000], view[5000:]]])) == [10_000]
    monkeypatch.undo()
    assert bytes(target) == data
    assert as_bytes(tier.get([b"short"])[0]) == data


def test_option_values_are_checked(url: str, opener: Opener) -> None:
    for name, value in (("io_threads", 0), ("capacity", "lots"), ("storage_options", [1])):
        with pytest.raises(ConfigError) as info:
            default_registry().create("fs").open(options(url, **{name: value}), NS)
        assert info.value.key == name
    tier = opener(url, capacity="2KiB")
    assert tier.capabilities().capacity == 2048


# ---------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [None, 200_000])
def test_four_threads(url: str, opener: Opener, capacity: int | None) -> None:
    tier = opener(url, capacity=capacity)
    errors: list[BaseException] = []
    evicted: list[tuple[bytes, BytesLike]] = []
    lock = threading.Lock()
    shared = [f"shared-{i}".encode() for i in range(16)]

    def worker(t: int) -> None:
        try:
            rng = random.Random(t)
            mine = [f"t{t}-{i}".encode() for i in range(40)]
            for i in range(0, 40, 4):
                keys = [*mine[i : i + 4], rng.choice(shared)]
                blocks = [blob(3000 + len(k), sum(k)) for k in keys]
                local_evicted: list[tuple[bytes, BytesLike]] = []
                if i % 8:
                    tier.put(keys, blocks, local_evicted)
                else:
                    tier.put_parts(keys, [[b[:10], b[10:]] for b in blocks], local_evicted)
                with lock:
                    evicted.extend(local_evicted)
                for key, got in zip(keys, tier.get(keys), strict=True):
                    # a hit is always the whole block; under capacity a miss may happen
                    assert got is None or bytes(got) == blob(3000 + len(key), sum(key))
                tier.lookup(keys)
                if rng.random() < 0.3:
                    tier.evict([rng.choice(mine[: i + 4])])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    run_workers(worker, 4)
    assert errors == []
    stats = tier.stats()
    if capacity is not None:
        assert stats["used_bytes"] <= capacity
        assert evicted
    for key, data in evicted:
        assert bytes(data) == blob(3000 + len(key), sum(key))
    all_keys = [f"t{t}-{i}".encode() for t in range(4) for i in range(40)] + shared
    present = [k for k, g in zip(all_keys, tier.get(all_keys), strict=True) if g is not None]
    assert stats["blocks"] == len(present)
    assert stats["used_bytes"] == sum(3000 + len(k) for k in present)
    if url.startswith("file://"):
        names = [os.path.basename(p) for p in files_under(url)]
        assert len(names) == len(present)


class Paused:
    """A store method that holds its caller until resumed: before the real call, or
    ``after`` it.  Lets a test stop one thread at a chosen point of a race."""

    def __init__(self, real: Callable[[bytes], Any], after: bool = False) -> None:
        self.real, self.after = real, after
        self.reached, self.resume = threading.Event(), threading.Event()

    def __call__(self, key: bytes) -> Any:
        if not self.after:
            self._hold()
        result = self.real(key)
        if self.after:
            self._hold()
        return result

    def _hold(self) -> None:
        self.reached.set()
        assert self.resume.wait(10)


def test_a_put_during_an_eviction_of_its_key_is_written_after_it(
    url: str, opener: Opener
) -> None:
    """The put waits for the deletion under way, or the deletion would remove the new
    file after the put was counted: a block indexed but not on disk."""
    tier = opener(url)
    data = blob(5000)
    assert list(tier.put([b"k"], [data], [])) == [True]
    store = tier.instance._store
    store.remove = remove = Paused(store.remove)
    evicting = threading.Thread(target=tier.evict, args=([b"k"],))
    evicting.start()
    assert remove.reached.wait(10)
    putting = threading.Thread(target=tier.put, args=([b"k", b"other"], [data, blob(4000)], []))
    putting.start()
    putting.join(0.3)
    assert putting.is_alive()  # waits for the deletion, not written under it
    remove.resume.set()
    evicting.join(10)
    putting.join(10)
    assert not putting.is_alive() and not evicting.is_alive()
    assert as_bytes(tier.get([b"k"])[0]) == data
    assert tier.stats()["blocks"] == 2


def test_a_read_that_overlapped_a_deletion_indexes_nothing(url: str, opener: Opener) -> None:
    """A get that read a block's file just before an evict deleted it must not put the
    key back into the index afterwards: a block counted against the capacity and
    answered by lookups, but on disk nowhere."""
    tier = opener(url)
    data = blob(5000)
    assert list(tier.put([b"k"], [data], [])) == [True]
    store = tier.instance._store
    store.remove = remove = Paused(store.remove)
    store.read = read = Paused(store.read, after=True)
    evicting = threading.Thread(target=tier.evict, args=([b"k"],))
    evicting.start()
    assert remove.reached.wait(10)  # the key is out of the index, its file not yet deleted
    got: list[object] = []
    getting = threading.Thread(target=lambda: got.extend(tier.get([b"k"])))
    getting.start()
    assert read.reached.wait(10)  # it read the file, still there
    remove.resume.set()
    evicting.join(10)
    read.resume.set()
    getting.join(10)
    assert not getting.is_alive() and not evicting.is_alive()
    assert as_bytes(got[0]) == data  # what it read was the block, whole
    store.read = read.real
    assert list(tier.lookup([b"k"])) == [False]
    assert (tier.stats()["blocks"], tier.stats()["used_bytes"]) == (0, 0)
