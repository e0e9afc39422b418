"""The ``fs`` backend's O_DIRECT reads: used where the filesystem allows, exact either way."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fs_blocks import open_fs, store_of

from kvtier import Namespace, open_chain
from kvtier.backends.fs import direct as fs_direct
from kvtier.backends.fs.direct import DIRECT_MIN
from kvtier.block.framing import ALIGN, ALIGN_MIN
from kvtier.plugins.registry import BackendHandle
from kvtier.tierbench.ceilings import drop_page_cache

#: Sizes around the direct threshold and the 4 KiB alignment, and a typical 2 MiB chunk.
SIZES = (DIRECT_MIN - 1, DIRECT_MIN, DIRECT_MIN + 1, (1 << 20) + 13, 2 << 20, 3 * 4096 * 100 - 7)


def drop_blocks(root: Path) -> None:
    """Push the block files under ``root`` out of the page cache, so a read reaches the disk."""
    drop_page_cache(sorted(root.rglob("*.kvb")))


def blob(size: int, seed: int) -> bytes:
    return random.Random(seed * 7919 + size).randbytes(size)


def scatter_lists(sizes: list[int]) -> tuple[list[bytearray], list[list[memoryview]]]:
    """One buffer per block, split like a tier splits header and payload, at odd places."""
    outs = [bytearray(n) for n in sizes]
    lists = []
    for out in outs:
        view = memoryview(out)
        cut = min(71, len(out))
        lists.append([view[:cut], view[cut:]])
    return outs, lists


def address(buf: Any) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)


class PreadvLog:
    """Records the iovec lengths (and addresses) of every ``os.preadv`` call, then makes it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[int]] = []
        self.addresses: list[list[int]] = []
        real = os.preadv

        self.nowait: list[list[int]] = []

        def preadv(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
            lengths = [memoryview(b).nbytes for b in buffers]
            if flags & getattr(os, "RWF_NOWAIT", 0):
                self.nowait.append(lengths)  # a try of the page cache, not a read counted below
            else:
                self.calls.append(lengths)
                self.addresses.append([address(b) for b in buffers])
            return real(fd, buffers, offset, flags)

        monkeypatch.setattr(os, "preadv", preadv)


def test_large_blocks_are_read_direct_and_exact(
    tmp_path: Path, handles: list[BackendHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = open_fs(tmp_path / "store", handles)
    if store_of(tier).direct_min == 0:
        pytest.skip("the backend did not enable O_DIRECT here")
    keys = [f"direct-{n}".encode() for n in SIZES]
    blocks = [blob(n, 1) for n in SIZES]
    assert all(tier.put(keys, blocks, []))
    drop_blocks(tmp_path / "store")
    log = PreadvLog(monkeypatch)
    outs, lists = scatter_lists(list(SIZES))
    assert list(tier.get_into(keys, lists)) == list(SIZES)
    assert [bytes(o) for o in outs] == blocks
    # a direct read is one aligned read into the bounce buffer, not the caller's list
    direct = [c for c in log.calls if len(c) == 1 and c[0] % 4096 == 0]
    scattered = [c for c in log.calls if len(c) == 2]
    small = [n for n in SIZES if n < DIRECT_MIN]
    assert len(direct) == len(SIZES) - len(small)
    assert len(scattered) == len(small)
    if store_of(tier).direct_min == 0:
        pytest.fail("the filesystem accepted O_DIRECT on open but refused the reads")


def test_cached_blocks_are_read_from_the_page_cache_into_the_callers_buffers(
    tmp_path: Path, handles: list[BackendHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = open_fs(tmp_path / "store", handles)
    store = store_of(tier)
    if store.direct_min == 0 or not store.nowait:
        pytest.skip("no O_DIRECT or no RWF_NOWAIT here")
    keys = [b"hot", b"cold"]
    blocks = [blob(2 << 20, 5), blob(2 << 20, 6)]
    assert all(tier.put(keys, blocks, []))
    # "hot" is read through the page cache (a direct write left it out), "cold" leaves it
    assert Path(store.path(b"hot")).read_bytes() == blocks[0]
    drop_page_cache([Path(store.path(b"cold"))])
    log = PreadvLog(monkeypatch)
    for key, data in zip(keys, blocks):
        outs, lists = scatter_lists([len(data)])
        assert list(tier.get_into([key], lists)) == [len(data)]
        assert bytes(outs[0]) == data
    # "hot" came from the cache straight into the caller's two buffers; "cold"
    # was not even tried there (a miss would start readahead of the whole file)
    # where the kernel can say what is cached
    tried = 2 if fs_direct._CACHESTAT_NR is None else 1
    assert log.nowait == [[71, (2 << 20) - 71]] * tried
    # only "cold" needed the disk: one aligned O_DIRECT read
    assert len(log.calls) == 1 and all(n % 4096 == 0 for n in log.calls[0])


def test_direct_io_off_reads_into_the_callers_buffers(
    tmp_path: Path, handles: list[BackendHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = open_fs(tmp_path / "store", handles, direct_io=False)
    assert store_of(tier).direct_min == 0
    data = blob(2 << 20, 2)
    assert all(tier.put([b"k"], [data], []))
    log = PreadvLog(monkeypatch)
    outs, lists = scatter_lists([len(data)])
    assert list(tier.get_into([b"k"], lists)) == [len(data)]
    assert bytes(outs[0]) == data
    assert log.calls == [[71, len(data) - 71]]


def test_filesystem_refusing_o_direct_falls_back(
    tmp_path: Path, handles: list[BackendHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Some filesystems (older tmpfs, some FUSE mounts) answer EINVAL to
    # O_DIRECT; the kernel here may not, so the refusal is simulated.
    real_fcntl = fcntl.fcntl
    refusals = []

    def fcntl_refusing_direct(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            refusals.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return int(real_fcntl(fd, cmd, arg))

    monkeypatch.setattr(fs_direct.fcntl, "fcntl", fcntl_refusing_direct)
    tier = open_fs(tmp_path / "store", handles)
    blocks = [blob(n, 3) for n in SIZES]
    keys = [f"refused-{n}".encode() for n in SIZES]
    assert all(tier.put(keys, blocks, []))
    tried = []
    for _ in range(2):  # both passes are exact
        # cached files would be read without trying O_DIRECT
        drop_blocks(tmp_path / "store")
        outs, lists = scatter_lists(list(SIZES))
        assert list(tier.get_into(keys, lists)) == list(SIZES)
        assert [bytes(o) for o in outs] == blocks
        tried.append(len(refusals))
    # refused at least once (threads racing may each try once), then remembered
    assert store_of(tier).direct_min == 0
    assert tried[0] >= 1 and tried[1] == tried[0]


def test_parallel_direct_reads_use_a_buffer_per_thread(
    tmp_path: Path, handles: list[BackendHandle]
) -> None:
    tier = open_fs(tmp_path / "store", handles, io_threads=8)
    sizes = [DIRECT_MIN + 4096 * i + i for i in range(48)]
    keys = [f"many-{i}".encode() for i in range(len(sizes))]
    blocks = [blob(n, i) for i, n in enumerate(sizes)]
    assert all(tier.put(keys, blocks, []))
    for attempt in range(3):
        if attempt:
            # the first pass reads the page cache, the rest the disk
            drop_blocks(tmp_path / "store")
        outs, lists = scatter_lists(sizes)
        assert list(tier.get_into(keys, lists)) == sizes
        assert [bytes(o) for o in outs] == blocks


def test_damaged_file_of_another_length_is_reported_not_read(
    tmp_path: Path, handles: list[BackendHandle]
) -> None:
    tier = open_fs(tmp_path / "store", handles)
    data = blob(1 << 20, 4)
    assert all(tier.put([b"d"], [data], []))
    assert tier.tamper(b"d", lambda b: b[: len(b) - 5000])
    outs, lists = scatter_lists([len(data)])
    # the stored size is answered so the tier can fall back; nothing is copied
    assert list(tier.get_into([b"d"], lists)) == [len(data) - 5000]
    assert bytes(outs[0]) == bytes(len(data))


def test_a_chain_reads_payloads_straight_into_aligned_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine case: KV rows in page-aligned memory, filled by the disk without a copy."""
    config = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/kv"}]}
    namespace = Namespace("direct-model", dtype="float32", tokens_per_block=32)
    row = 2 << 20
    region = mmap.mmap(-1, 4 * row)  # page aligned, like vLLM's host region
    rows = [memoryview(region)[i * row : (i + 1) * row] for i in range(4)]
    odd = ALIGN_MIN + 3  # an unaligned length: its tail goes through the bounce buffer
    payloads = [blob(row, i) for i in range(4)] + [blob(odd, 9)]
    keys = [f"chunk-{i}".encode() for i in range(5)]
    with open_chain(config, namespace=namespace) as chain:
        assert chain.put(keys, payloads) == [True] * 5
        if chain.tiers[0].handle.instance._store.direct_min == 0:
            pytest.skip("the backend did not enable O_DIRECT here")
        drop_blocks(tmp_path / "kv")
        log = PreadvLog(monkeypatch)
        tail = bytearray(odd)
        assert chain.get(keys, [*rows, memoryview(tail)]) == [True] * 5
        monkeypatch.undo()
    assert [bytes(r) for r in rows] == payloads[:4] and bytes(tail) == payloads[4]
    in_place = {address(r) for r in rows}
    for lengths, addresses in zip(log.calls, log.addresses):
        # header (one aligned page, through the bounce buffer) + payload
        assert lengths[0] == ALIGN
        if lengths[1] == row:
            in_place.discard(addresses[1])
        else:
            assert lengths[1] == odd + (-odd % ALIGN) and addresses[1] % ALIGN == 0
    assert not in_place, "some rows were not read into in place"
