"""Expiry wins over keep in the ``fs`` tier's shared pool, on real files: a kept block
expires, its file goes, and its mark with it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fs_blocks import blob, files_on_disk, open_fs

from kvtier.plugins.registry import BackendHandle

SIZE = 8 << 10
ACME = "a" * 32


def tier(root: Path, handles: list[BackendHandle], **over: Any) -> BackendHandle:
    return open_fs(root, handles, ACME, capacity=16 * SIZE, capacity_scope="pool",
                   direct_io=False, tenant="acme", tenants={"acme": {"keep": 4 * SIZE}},
                   **over)


def key(i: int) -> bytes:
    return b"keep-%04d" % i


def put(handle: BackendHandle, ids: list[int]) -> None:
    for i in ids:
        assert handle.put([key(i)], [blob(SIZE, i)], []) == [True]


def test_a_kept_block_still_expires(tmp_path: Path, handles: list[BackendHandle]) -> None:
    """Expiry wins over keep: the kept block's file goes, and its mark with it."""
    acme = tier(tmp_path, handles, expire="500ms")
    put(acme, [1, 2])
    assert acme.keep([key(1)], True) == [True]
    time.sleep(0.8)
    assert acme.get([key(1)]) == [None]
    put(acme, [3])  # the sweep
    assert list(files_on_disk(tmp_path, ACME)) == [key(3)]
    assert dict(acme.stats())["kept_bytes"] == 0
    put(acme, [1])  # stored again: unmarked
    assert dict(acme.stats())["kept_bytes"] == 0
