"""The fs tier's ``expire``, with real time on a real directory: expired blocks are misses,
and their files are removed and counted; unexpired ones read back byte for byte."""

from __future__ import annotations

import time
from pathlib import Path

from fs_blocks import as_bytes, blob, files_on_disk, open_fs

from kvtier.plugins.registry import BackendHandle


def key(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"exp"


def put(handle: BackendHandle, ids: list[int]) -> None:
    assert handle.put([key(i) for i in ids], [blob(1000, i) for i in ids], []) == [True] * len(ids)


def exact(handle: BackendHandle, ids: list[int]) -> list[int]:
    """The ids whose get returns their exact bytes; a wrong byte fails the test."""
    out = []
    for i, data in zip(ids, handle.get([key(i) for i in ids]), strict=True):
        if data is not None:
            assert as_bytes(data) == blob(1000, i), i
            out.append(i)
    return out


def test_blocks_expire_after_their_write_and_a_put_removes_their_files(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    tier = open_fs(tmp_path, handles, expire="600ms", tenant="acme")
    put(tier, [1, 2, 3])
    assert exact(tier, [1, 2, 3]) == [1, 2, 3]
    time.sleep(0.8)
    assert tier.get([key(1)]) == [None]  # a miss at once
    put(tier, [4])  # the sweep: every expired block's file leaves
    assert sorted(files_on_disk(tmp_path)) == [key(4)]
    assert exact(tier, [1, 2, 3, 4]) == [4]
    stats = dict(tier.stats())
    assert (stats["expired"], stats["tenant_expired.acme"], stats["used_bytes"]) == (3, 3, 1000)


def test_blocks_expire_unused(tmp_path: Path, handles: list[BackendHandle]) -> None:
    tier = open_fs(tmp_path, handles, expire={"unused": "1s"})
    put(tier, [1, 2])
    time.sleep(0.6)
    assert exact(tier, [1]) == [1]  # a use
    time.sleep(0.6)
    # 2 unused for 1.2s: gone; 1 used 0.6s ago: exact bytes
    assert exact(tier, [1, 2]) == [1]
    put(tier, [3])
    assert sorted(files_on_disk(tmp_path)) == [key(1), key(3)]


def test_a_block_another_process_wrote_expires_by_its_file_s_time(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    writer = open_fs(tmp_path, handles)  # no expire: another configuration, or process
    put(writer, [1])
    time.sleep(1.2)
    put(writer, [2])
    reader = open_fs(tmp_path, handles, expire="1s")
    assert exact(reader, [1, 2]) == [2]  # 1's file is 1.2s old, 2's is new


def test_a_shared_pool_counts_the_bytes_expiry_frees(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    tier = open_fs(tmp_path, handles, capacity="1MiB", expire="600ms")
    put(tier, [1, 2])
    assert dict(tier.stats())["used_bytes"] == 2000
    time.sleep(0.8)
    put(tier, [3])
    assert dict(tier.stats())["used_bytes"] == 1000 and exact(tier, [1, 2, 3]) == [3]
