"""The ``fs`` backend through the registry, on a local directory and on ``memory://``."""

from __future__ import annotations

import array
import errno
import importlib.util
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from kvtier.plugins.registry import BackendHandle, default_registry
from kvtier.spec import BackendError, BytesLike, ClosedError, ConfigError

NS = "0123456789abcdef0123456789abcdef"
Opener = Callable[..., BackendHandle]


def blob(size: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + size).randbytes(size)


def options(url: str, **over: Any) -> dict[str, Any]:
    # no config loader runs here: every option is passed, defaults included
    opts: dict[str, Any] = {
        "url": url,
        "capacity": None,
        "fsync": False,
        "io_threads": 4,
        "storage_options": {},
    }
    opts.update(over)
    return opts


@pytest.fixture(params=["file", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "file":
        yield f"file://{tmp_path}/store"
        return
    root = f"/kvtier-test-{uuid.uuid4().hex}"
    yield f"memory://{root}"
    mem = fsspec.filesystem("memory")
    if mem.exists(root):
        mem.rm(root, recursive=True)


@pytest.fixture
def local_url(tmp_path: Path) -> str:
    return f"file://{tmp_path}/store"


@pytest.fixture
def opener() -> Iterator[Opener]:
    handles: list[BackendHandle] = []

    def open_(url: str, namespace: str = NS, **over: Any) -> BackendHandle:
        handle = default_registry().create("fs")
        handle.open(options(url, **over), namespace)
        handles.append(handle)
        return handle

    yield open_
    for handle in handles:
        handle.close()


def block_path(url: str, key: bytes, namespace: str = NS) -> str:
    h = key.hex()
    return f"{url.removeprefix('file://')}/{namespace}/{h[0:2]}/{(h[2:4] or '00')}/{h}.kvb"


def files_under(url: str) -> list[str]:
    root = url.removeprefix("file://")
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


def as_bytes(data: BytesLike | None) -> bytes | None:
    return None if data is None else bytes(data)


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
# layout and publishing
# ---------------------------------------------------------------------------


def test_layout_on_disk(local_url: str, opener: Opener) -> None:
    tier = opener(local_url)
    keys = [bytes([0xAB]), bytes.fromhex("abcdef"), bytes(range(64)), b"../../etc/passwd"]
    blocks = [blob(10 + i, i) for i in range(len(keys))]
    assert all(tier.put(keys, blocks, []))
    root = local_url.removeprefix("file://")
    expected = [
        f"{root}/{NS}/ab/00/ab.kvb",
        f"{root}/{NS}/ab/cd/abcdef.kvb",
        f"{root}/{NS}/00/01/{bytes(range(64)).hex()}.kvb",
        f"{root}/{NS}/2e/2e/{b'../../etc/passwd'.hex()}.kvb",
    ]
    assert files_under(local_url) == sorted(expected)
    for path, data in zip(expected, blocks, strict=True):
        assert path == block_path(local_url, keys[expected.index(path)])
        assert Path(path).read_bytes() == data


def test_namespaces_are_separate(url: str, opener: Opener) -> None:
    one = opener(url)
    other = opener(url, namespace="f" * 32)
    assert all(one.put([b"k"], [b"one"], []))
    assert other.get([b"k"]) == [None]
    assert list(other.lookup([b"k"])) == [False]
    assert all(other.put([b"k"], [b"other"], []))
    assert as_bytes(one.get([b"k"])[0]) == b"one"
    assert as_bytes(other.get([b"k"])[0]) == b"other"


def test_no_temp_files_left(local_url: str, opener: Opener) -> None:
    tier = opener(local_url, fsync=True)
    keys = [f"t{i}".encode() for i in range(50)]
    assert all(tier.put(keys, [blob(3000, i) for i in range(50)], []))
    assert all(tier.put_parts(keys[:5], [[b"h", blob(10, i)] for i in range(5)], []))
    names = [os.path.basename(p) for p in files_under(local_url)]
    assert len(names) == 50
    assert not [n for n in names if n.startswith(".tmp-")]


def test_written_files_are_plain_files(local_url: str, opener: Opener) -> None:
    tier = opener(local_url)
    data = blob(123_456)
    assert all(tier.put_parts([b"plain"], [[data[:100], data[100:]]], []))
    with open(block_path(local_url, b"plain"), "rb") as f:
        assert f.read() == data


# ---------------------------------------------------------------------------
# capacity and eviction
# ---------------------------------------------------------------------------


def test_capacity_lru_and_evicted_reports(url: str, opener: Opener) -> None:
    cap = 50_000
    tier = opener(url, capacity=cap)
    assert tier.capabilities().capacity == cap
    assert tier.capabilities().reports_evictions
    rng = random.Random(42)
    model: dict[bytes, bytes] = {}  # what should be stored
    for step in range(60):
        batch = rng.choice([1, 1, 2, 5])
        keys = [f"c{step}-{j}".encode() for j in range(batch)]
        blocks = [blob(rng.randint(1, 12_000), step * 10 + j) for j in range(batch)]
        evicted: list[tuple[bytes, BytesLike]] = []
        assert list(tier.put(keys, blocks, evicted)) == [True] * batch
        model.update(zip(keys, blocks, strict=True))
        for key, data in evicted:
            assert model.pop(key) == bytes(data)  # exactly the removed keys, with their bytes
        stats = tier.stats()
        assert stats["used_bytes"] <= cap
        assert stats["used_bytes"] == sum(map(len, model.values()))
        assert stats["blocks"] == len(model)
        if step % 7 == 0 and model:
            # reading a block makes it the most recently used
            hot = next(iter(model))
            assert as_bytes(tier.get([hot])[0]) == model[hot]
            model[hot] = model.pop(hot)
    all_keys = [f"c{s}-{j}".encode() for s in range(60) for j in range(5)]
    found = dict(zip(all_keys, tier.get(all_keys), strict=True))
    assert {k: bytes(v) for k, v in found.items() if v is not None} == model


def test_capacity_evicts_in_lru_order(url: str, opener: Opener) -> None:
    tier = opener(url, capacity=3000)
    for key in (b"a", b"b", b"c"):
        assert all(tier.put([key], [blob(1000, key[0])], []))
    assert tier.get([b"a"])[0] is not None  # a is now the most recent
    evicted: list[tuple[bytes, BytesLike]] = []
    assert all(tier.put([b"d"], [blob(1000, 100)], evicted))
    assert [k for k, _ in evicted] == [b"b"]
    assert list(tier.lookup([b"a", b"b", b"c", b"d"])) == [True, False, True, True]


def test_batch_larger_than_capacity_behaves_like_single_puts(url: str, opener: Opener) -> None:
    tier = opener(url, capacity=3000)
    keys = [f"b{i}".encode() for i in range(5)]
    blocks = [blob(1000, i) for i in range(5)]
    evicted: list[tuple[bytes, BytesLike]] = []
    assert list(tier.put(keys, blocks, evicted)) == [True] * 5
    # the two oldest were pushed out by the later ones, bytes reported all the same
    assert [(k, bytes(v)) for k, v in evicted] == list(zip(keys[:2], blocks[:2], strict=True))
    assert list(tier.lookup(keys)) == [False, False, True, True, True]
    assert tier.stats()["used_bytes"] == 3000
    if url.startswith("file://"):
        assert len(files_under(url)) == 3


def test_block_larger_than_capacity_is_refused(url: str, opener: Opener) -> None:
    tier = opener(url, capacity=1000)
    evicted: list[tuple[bytes, BytesLike]] = []
    assert all(tier.put([b"small"], [blob(1000)], evicted))
    assert list(tier.put([b"big", b"ok"], [blob(1001), blob(10)], evicted)) == [False, True]
    assert [k for k, _ in evicted] == [b"small"]
    assert tier.get([b"big"]) == [None]
    assert tier.stats()["used_bytes"] == 10


def test_evict_is_not_reported_as_eviction(url: str, opener: Opener) -> None:
    tier = opener(url, capacity=10_000)
    assert all(tier.put([b"x"], [blob(100)], []))
    assert list(tier.evict([b"x", b"never"])) == [True, False]
    assert tier.stats()["evictions"] == 0
    assert tier.stats()["used_bytes"] == 0


# ---------------------------------------------------------------------------
# persistence and sharing
# ---------------------------------------------------------------------------


def test_restart_rebuilds_the_index(url: str, opener: Opener) -> None:
    tier = opener(url)
    keys = [f"r{i}".encode() for i in range(20)]
    blocks = [blob(500 * i + 1, i) for i in range(20)]
    assert all(tier.put(keys, blocks, []))
    tier.close()
    tier.close()  # idempotent

    again = opener(url)
    assert again.stats()["used_bytes"] == sum(map(len, blocks))
    assert again.stats()["blocks"] == 20
    assert list(again.lookup(keys)) == [True] * 20
    assert [as_bytes(g) for g in again.get(keys)] == blocks
    assert again.capabilities().persistent == url.startswith("file://")


def test_restart_orders_lru_by_mtime(local_url: str, opener: Opener) -> None:
    tier = opener(local_url)
    keys = [b"old", b"new", b"mid"]
    assert all(tier.put(keys, [blob(1000, i) for i in range(3)], []))
    tier.close()
    now = time.time()
    for key, age in zip(keys, (300, 100, 200), strict=True):
        os.utime(block_path(local_url, key), (now - age, now - age))
    # without the index file (it would keep the order of use itself) file age decides
    index = Path(block_path(local_url, b"old")).parents[2] / "index.kvi"
    index.unlink()
    again = opener(local_url, capacity=3000)
    evicted: list[tuple[bytes, BytesLike]] = []
    assert all(again.put([b"n1", b"n2"], [blob(1000, 7), blob(1000, 8)], evicted))
    assert [(k, bytes(v)) for k, v in evicted] == [(b"old", blob(1000, 0)), (b"mid", blob(1000, 2))]


def test_reopen_with_smaller_capacity_evicts_on_next_put(local_url: str, opener: Opener) -> None:
    tier = opener(local_url)
    assert all(tier.put([b"a", b"b", b"c"], [blob(1000, i) for i in range(3)], []))
    tier.close()
    small = opener(local_url, capacity=1500)
    evicted: list[tuple[bytes, BytesLike]] = []
    assert all(small.put([b"d"], [blob(500)], evicted))
    # down to the capacity, and reported like any eviction
    assert len(evicted) == 2
    for key, data in evicted:
        assert bytes(data) == blob(1000, b"abc".index(key))
    assert small.stats()["used_bytes"] == 1500


def test_two_instances_share_one_directory(url: str, opener: Opener) -> None:
    a = opener(url)
    b = opener(url)
    data = blob(70_000)
    assert all(a.put([b"shared"], [data], []))
    # b never wrote it, but the store is the authority
    assert list(b.lookup([b"shared", b"absent"])) == [True, False]
    assert as_bytes(b.get([b"shared"])[0]) == data
    out = bytearray(len(data))
    assert list(b.get_into([b"shared"], [[memoryview(out)]])) == [len(data)]
    assert bytes(out) == data
    assert b.stats()["blocks"] == 1
    assert b.stats()["used_bytes"] == len(data)

    # b writes, a sees it in a batch lookup
    more = [f"m{i}".encode() for i in range(8)]
    assert all(b.put(more, [blob(100, i) for i in range(8)], []))
    assert list(a.lookup([*more, b"nope"])) == [True] * 8 + [False]

    # b evicts what a wrote: a gets a miss, not an error, and forgets it
    assert list(b.evict([b"shared"])) == [True]
    assert a.get([b"shared"]) == [None]
    assert list(a.get_into([b"shared"], [[memoryview(out)]])) == [None]
    assert list(a.lookup([b"shared"])) == [False]
    assert a.stats()["used_bytes"] == 800
    assert list(a.evict([b"shared"])) == [False]
    # a evicts what only b wrote
    assert list(a.evict(more[:2])) == [True, True]
    assert b.get(more[:2]) == [None, None]


def test_tamper_truncated_block_is_returned_as_stored(url: str, opener: Opener) -> None:
    tier = opener(url)
    data = blob(8192)
    assert all(tier.put([b"rot"], [data], []))
    assert tier.implements("kvtier_tamper")
    assert tier.tamper(b"rot", lambda b: b[:100]) is True
    assert as_bytes(tier.get([b"rot"])[0]) == data[:100]
    assert list(tier.get_into([b"rot"], [[memoryview(bytearray(8192))]])) == [100]
    assert tier.tamper(b"rot", lambda b: b[:50] + b"\xff" + b[51:]) is True
    assert as_bytes(tier.get([b"rot"])[0]) == data[:50] + b"\xff" + data[51:100]
    assert tier.tamper(b"missing", lambda b: b) is False


def test_stale_temp_files_and_foreign_files_are_ignored(local_url: str, opener: Opener) -> None:
    tier = opener(local_url)
    assert all(tier.put([b"real"], [blob(1234)], []))
    tier.close()
    fan = os.path.dirname(block_path(local_url, b"real"))
    nsdir = f"{local_url.removeprefix('file://')}/{NS}"
    old, fresh = f"{fan}/.tmp-1-dead", f"{fan}/.tmp-2-busy"
    for path in (old, fresh):
        Path(path).write_bytes(b"partial")
    long_ago = time.time() - 3600
    os.utime(old, (long_ago, long_ago))
    # not blocks: wrong names, wrong place, a directory with a block's name
    Path(f"{fan}/notes.txt").write_bytes(b"x")
    Path(f"{fan}/ABCD.kvb").write_bytes(b"x")
    Path(f"{fan}/abc.kvb").write_bytes(b"x")
    Path(f"{fan}/ffff.kvb").write_bytes(b"x")
    Path(f"{nsdir}/zz").mkdir()
    Path(f"{nsdir}/ff/ff/ffff.kvb").mkdir(parents=True)

    again = opener(local_url)
    assert again.stats()["blocks"] == 1
    assert again.stats()["used_bytes"] == 1234
    assert again.stats()["stale_tmp_removed"] == 1
    assert not os.path.exists(old)
    assert os.path.exists(fresh)  # may belong to a live writer elsewhere
    assert as_bytes(again.get([b"real"])[0]) == blob(1234)


def test_junk_in_memory_store_is_ignored(opener: Opener) -> None:
    root = f"/kvtier-test-{uuid.uuid4().hex}"
    mem = fsspec.filesystem("memory")
    try:
        tier = opener(f"memory://{root}")
        assert all(tier.put([b"real"], [b"12345"], []))
        tier.close()
        mem.pipe_file(f"{root}/{NS}/72/65/.tmp-1-x", b"partial")
        mem.pipe_file(f"{root}/{NS}/notes.txt", b"x")
        mem.pipe_file(f"{root}/{NS}/ff/ff/abcd.kvb", b"x")
        again = opener(f"memory://{root}")
        assert again.stats()["blocks"] == 1
        assert again.stats()["used_bytes"] == 5
    finally:
        mem.rm(root, recursive=True)


# ---------------------------------------------------------------------------
# faults
# ---------------------------------------------------------------------------


def _chmod_is_effective(path: Path) -> bool:
    path.chmod(0o555)
    try:
        return not os.access(path, os.W_OK)
    finally:
        path.chmod(0o755)


def test_read_only_directory(tmp_path: Path, opener: Opener) -> None:
    if not _chmod_is_effective(tmp_path):
        pytest.skip("running as root: chmod does not stop writes")
    url = f"file://{tmp_path}/store"
    tier = opener(url)
    fan = Path(block_path(url, b"ro")).parent
    fan.mkdir(parents=True)
    fan.chmod(0o555)
    try:
        with pytest.raises(BackendError):
            tier.put([b"ro"], [blob(100)], [])
        assert list(fan.iterdir()) == []
        assert tier.get([b"ro"]) == [None]
    finally:
        fan.chmod(0o755)
    (tmp_path / "store").chmod(0o555)
    (tmp_path / "store" / NS).chmod(0o555)
    try:
        with pytest.raises(BackendError):
            opener(url)
    finally:
        (tmp_path / "store" / NS).chmod(0o755)
        (tmp_path / "store").chmod(0o755)


def test_failed_write_raises_and_leaves_nothing(
    local_url: str, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = opener(local_url)
    assert all(tier.put([b"before"], [blob(10)], []))

    def full(fd: int, buffers: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "writev", full)
    for keys in ([b"x"], [b"y", b"z", b"before"]):
        with pytest.raises(BackendError) as info:
            tier.put(keys, [blob(5000, i) for i in range(len(keys))], [])
        assert info.value.errno == errno.ENOSPC
        assert isinstance(info.value, OSError)
    monkeypatch.undo()
    assert [os.path.basename(p) for p in files_under(local_url)] == [b"before".hex() + ".kvb"]
    assert tier.get([b"x", b"y", b"before"]) == [None, None, blob(10)]
    assert tier.stats()["used_bytes"] == 10
    assert all(tier.put([b"x"], [blob(5000)], []))


def test_failed_write_on_fsspec_raises(opener: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    root = f"/kvtier-test-{uuid.uuid4().hex}"
    tier = opener(f"memory://{root}")
    mem = fsspec.filesystem("memory")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(mem, "pipe_file", broken)
    try:
        with pytest.raises(BackendError):
            tier.put([b"a", b"b"], [b"1", b"2"], [])
        monkeypatch.undo()
        assert tier.get([b"a", b"b"]) == [None, None]
        assert tier.stats()["used_bytes"] == 0
    finally:
        mem.rm(root, recursive=True)


def test_open_errors(tmp_path: Path) -> None:
    def open_(url: str) -> None:
        default_registry().create("fs").open(options(url), NS)

    with pytest.raises(ConfigError) as info:
        open_("nosuchproto://bucket/x")
    assert info.value.key == "url"
    assert "nosuchproto://bucket/x" in str(info.value)
    with pytest.raises(ConfigError) as info:
        open_("relative/path")
    assert info.value.key == "url"
    with pytest.raises(ConfigError) as info:
        default_registry().create("fs").open(options("memory://x"), "../escape")
    # credentials in a URL never reach the message
    with pytest.raises(ConfigError) as info:
        open_("nosuchproto://user:secret@host/x")
    assert "secret" not in str(info.value)
    # root is a file, not a directory
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(BackendError):
        open_(str(tmp_path / "file"))


def test_missing_fsspec_package_is_named() -> None:
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed")
    with pytest.raises(ConfigError) as info:
        default_registry().create("fs").open(options("gcs://bucket/x"), NS)
    assert info.value.key == "url"
    assert "gcsfs" in str(info.value)


def test_closed_backend(url: str) -> None:
    tier = default_registry().create("fs")
    with pytest.raises(ClosedError):
        tier.get([b"k"])
    tier.open(options(url), NS)
    tier.close()
    for call in (
        lambda: tier.put([b"k"], [b"v"], []),
        lambda: tier.put_parts([b"k"], [[b"v"]], []),
        lambda: tier.get([b"k"]),
        lambda: tier.get_into([b"k"], [[]]),
        lambda: tier.lookup([b"k"]),
        lambda: tier.evict([b"k"]),
        lambda: tier.tamper(b"k", bytes),
        tier.stats,
        tier.capabilities,
    ):
        with pytest.raises(ClosedError):
            call()
    tier.close()


def test_capabilities_and_options(url: str, opener: Opener) -> None:
    fresh = default_registry().create("fs")
    opts = fresh.options()
    assert set(opts) == {
        "url", "capacity", "fsync", "io_threads", "direct_io", "storage_options"
    }
    assert opts["url"].required
    assert opts["storage_options"].secret
    assert opts["io_threads"].default == 4
    caps = opener(url).capabilities()
    local = url.startswith("file://")
    assert caps.persistent is local
    assert caps.shared is local
    assert caps.thread_safe
    assert caps.reports_evictions
    assert caps.capacity is None


def test_plain_path_and_single_thread(tmp_path: Path, opener: Opener) -> None:
    tier = opener(str(tmp_path / "plain"), io_threads=1, fsync=True)
    keys = [f"p{i}".encode() for i in range(10)]
    blocks = [blob(100 * i + 1, i) for i in range(10)]
    assert all(tier.put(keys, blocks, []))
    assert [as_bytes(g) for g in tier.get(keys)] == blocks
    assert os.path.exists(block_path(str(tmp_path / "plain"), keys[0]))


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

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
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
