"""The ``fs`` backend's files: the layout on disk, publishing, restarts and sharing."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import fsspec
from fs_blocks import NS, Opener, as_bytes, blob, block_path, files_under

from kvtier.spec import BytesLike

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
    assert callable(tier.instance.kit_tamper)  # the kit's raw access, no hook
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
