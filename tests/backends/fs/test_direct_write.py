"""The ``fs`` backend's O_DIRECT writes: every file byte-exact, the page cache left alone."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from pathlib import Path
from typing import Any

import pytest
from fs_blocks import Opener, blob, store_of

from kvtier import Namespace, open_chain
from kvtier.backends.fs import direct as fs_direct
from kvtier.backends.fs.direct import DIRECT_MIN
from kvtier.block.framing import ALIGN

#: Around the direct threshold and the 4 KiB alignment, and whole aligned chunks.
SIZES = (DIRECT_MIN - 1, DIRECT_MIN, DIRECT_MIN + 1, (1 << 20) + 13, 2 << 20, 3 * 4096 * 100 - 7)


class WriteLog:
    """Records, per ``os.pwritev`` call, whether the file had O_DIRECT set, then makes it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.direct: list[bool] = []
        self.buffered = 0
        real_pwritev, real_writev = os.pwritev, os.writev

        def pwritev(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
            self.direct.append(bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT))
            return real_pwritev(fd, buffers, offset, flags)

        def writev(fd: int, buffers: Any) -> int:
            self.buffered += 1
            return real_writev(fd, buffers)

        monkeypatch.setattr(os, "pwritev", pwritev)
        monkeypatch.setattr(os, "writev", writev)


def aligned_copy(data: bytes) -> memoryview:
    """``data`` in page-aligned memory, as an engine's KV rows are."""
    region = mmap.mmap(-1, max(len(data), 1))
    region[: len(data)] = data
    return memoryview(region)[: len(data)]


def test_large_blocks_are_written_direct_and_exact(
    local_url: str, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = opener(local_url)
    store = store_of(tier)
    if store.direct_min == 0:
        pytest.skip("the backend did not enable O_DIRECT here")
    log = WriteLog(monkeypatch)
    keys, parts = [], []
    for i, size in enumerate(SIZES):
        # a page of header, then a payload in aligned memory or in a bytes object
        payload = blob(size, i)
        keys.append(f"w-{size}".encode())
        parts.append([blob(ALIGN, 100 + i), aligned_copy(payload) if i % 2 else payload])
    assert list(tier.put_parts(keys, parts, [])) == [True] * len(keys)
    monkeypatch.undo()
    large = [ALIGN + n >= DIRECT_MIN for n in SIZES]
    assert sorted(log.direct) == [True] * sum(large)
    assert log.buffered == len(SIZES) - sum(large)
    for key, (head, payload) in zip(keys, parts):
        path = Path(store.path(key))
        assert path.stat().st_size == len(head) + len(payload)
        assert path.read_bytes() == bytes(head) + bytes(payload)


def test_direct_writes_leave_the_page_cache_alone(local_url: str, opener: Opener) -> None:
    tier = opener(local_url)
    store = store_of(tier)
    if store.direct_min == 0:
        pytest.skip("the backend did not enable O_DIRECT here")
    data = blob(2 << 20, 7)
    assert list(tier.put([b"cold"], [data], [])) == [True]
    fd = os.open(store.path(b"cold"), os.O_RDONLY)
    try:
        cached = fs_direct._all_cached(fd, len(data))
    finally:
        os.close(fd)
    if cached is None:
        pytest.skip("the kernel cannot say what is cached (no cachestat)")
    assert cached is False
    outs = [bytearray(len(data))]
    assert list(tier.get_into([b"cold"], [[memoryview(outs[0])]])) == [len(data)]
    assert bytes(outs[0]) == data


def test_direct_io_off_writes_through_the_page_cache(
    local_url: str, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = opener(local_url, direct_io=False)
    log = WriteLog(monkeypatch)
    data = blob(2 << 20, 8)
    assert list(tier.put([b"k"], [data], [])) == [True]
    monkeypatch.undo()
    assert log.direct == [] and log.buffered == 1
    assert Path(store_of(tier).path(b"k")).read_bytes() == data


def test_a_filesystem_refusing_direct_writes_gets_buffered_ones(
    local_url: str, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_pwritev = os.pwritev
    refused = []

    def pwritev_refusing_direct(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwritev(fd, buffers, offset, flags)

    monkeypatch.setattr(os, "pwritev", pwritev_refusing_direct)
    tier = opener(local_url, io_threads=1)
    if store_of(tier).direct_min == 0:
        pytest.skip("the backend did not enable O_DIRECT here")
    blocks = [blob(2 << 20, 9), blob(DIRECT_MIN + 5, 10)]
    assert list(tier.put([b"a", b"b"], blocks, [])) == [True, True]
    monkeypatch.undo()
    assert len(refused) == 1 and store_of(tier).direct_min == 0
    for key, data in zip([b"a", b"b"], blocks):
        assert Path(store_of(tier).path(key)).read_bytes() == data


def test_a_chain_stores_engine_rows_and_reads_them_back(tmp_path: Path) -> None:
    """The engine case: rows of page-aligned memory written down and read back exactly."""
    config = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/kv"}]}
    namespace = Namespace("direct-write-model", dtype="float32", tokens_per_block=32)
    row = 1 << 20
    region = mmap.mmap(-1, 6 * row)
    payloads = [blob(row, 20 + i) for i in range(6)]
    for i, data in enumerate(payloads):
        region[i * row : (i + 1) * row] = data
    rows = [memoryview(region)[i * row : (i + 1) * row] for i in range(6)]
    keys = [f"row-{i}".encode() for i in range(6)]
    with open_chain(config, namespace=namespace) as chain:
        assert chain.put(keys, rows) == [True] * 6
        region[:] = bytes(len(region))  # the engine reuses its rows
        assert chain.get(keys, rows) == [True] * 6
    assert [bytes(r) for r in rows] == payloads


def test_a_block_ending_off_the_alignment_is_not_cut_back(
    local_url: str, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sealed block ends in its 16-byte tag: the aligned part goes with O_DIRECT and
    the tail through the page cache, with no cut of the file after (on ext4 a cut
    reads the last block back from the disk, at once)."""
    tier = opener(local_url)
    store = store_of(tier)
    if store.direct_min == 0:
        pytest.skip("the backend did not enable O_DIRECT here")
    log = WriteLog(monkeypatch)
    cuts: list[int] = []
    real_ftruncate = os.ftruncate

    def ftruncate(fd: int, length: int) -> None:
        cuts.append(length)
        real_ftruncate(fd, length)

    monkeypatch.setattr(os, "ftruncate", ftruncate)
    head, payload, tag = blob(ALIGN, 30), aligned_copy(blob(2 << 20, 31)), blob(16, 32)
    assert list(tier.put_parts([b"sealed"], [[head, payload, tag]], [])) == [True]
    monkeypatch.undo()
    assert log.direct == [True] and cuts == []
    assert Path(store.path(b"sealed")).read_bytes() == head + bytes(payload) + tag


def test_a_short_direct_write_is_written_again_whole(
    local_url: str, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = opener(local_url, io_threads=1)
    store = store_of(tier)
    if store.direct_min == 0:
        pytest.skip("the backend did not enable O_DIRECT here")
    real_pwritev = os.pwritev

    def short_pwritev(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
        got = real_pwritev(fd, buffers, offset, flags)
        return got - ALIGN if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT else got

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    data = blob((2 << 20) + 5, 33)
    assert list(tier.put([b"short"], [data], [])) == [True]
    monkeypatch.undo()
    assert Path(store.path(b"short")).read_bytes() == data
