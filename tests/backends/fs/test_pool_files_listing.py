"""The pool's own files measured at a cost that does not grow with the namespaces of its root
(kvtier.backends.fs.pool_files, docs/shared-capacity.md "The pool's own files").

A listing of a pooled root takes a ``stat`` per namespace (its ``index.kvi``):
with many tenants, a namespace each, listing it at every grant made every put
that takes room pay for all of them.  A listing now serves until the root
changes, or for at most :data:`~kvtier.backends.fs.pool_files.STALE_S`; the
capacity still holds the files it counts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from fs_blocks import NS
from fs_pool_child import block, open_backend

from kvtier.backends.fs import pool_files
from kvtier.backends.fs.index import INDEX_NAME
from kvtier.backends.fs.pool_files import ALLOWANCE
from kvtier.backends.fs.pool_writers import journal_path

KiB, MiB = 1 << 10, 1 << 20


def namespaces(root: Path, count: int, size: int) -> list[Path]:
    """``count`` namespaces closed before (another tenant's each), an ``index.kvi`` of
    ``size`` bytes in each."""
    made = []
    for i in range(count):
        folder = root / f"{i:032x}"
        folder.mkdir(parents=True)
        (folder / INDEX_NAME).write_bytes(os.urandom(size))
        made.append(folder)
    return made


def test_a_put_that_takes_room_does_not_list_every_namespace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "pool"
    namespaces(root, 300, 1 * KiB)
    cap, size = 1 * MiB, 16 * KiB
    listed: list[str] = []
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        if os.fspath(path) == str(root):
            listed.append(os.fspath(path))
        return real(path)

    tier = open_backend({"url": str(root), "namespace": NS, "options": {"capacity": cap}})
    try:
        for i in range(2 * cap // size):  # full: each put from here evicts and takes room
            assert list(tier.put([b"f%d" % i], [block(b"f%d" % i, size)], [])) == [True]
        time.sleep(0.2)  # the root quiet since its last change (the writer's journal)
        monkeypatch.setattr(os, "scandir", scandir)
        puts = 200
        for i in range(puts):
            key = b"k%d" % i
            assert list(tier.put([key], [block(key, size)], [])) == [True]
        monkeypatch.undo()
        stats = tier.stats()
        assert stats["pool_evictions"] >= puts  # each put evicted, in a transaction
        # the listing of 300 namespaces at every grant was 200 listings (one a put)
        assert len(listed) <= puts // 10, len(listed)
        # the 300 index.kvi are counted all the same
        assert stats["pool_files_bytes"] >= 300 * KiB
    finally:
        tier.close()


def test_an_index_written_beside_a_full_pool_is_counted_within_a_second(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    other = namespaces(root, 1, 100)[0]
    cap, size = 4 * MiB, 64 * KiB
    tier = open_backend({"url": str(root), "namespace": NS, "options": {"capacity": cap}})
    try:
        for i in range(2 * cap // size):
            assert list(tier.put([b"f%d" % i], [block(b"f%d" % i, size)], [])) == [True]
        before = tier.stats()["pool_files_bytes"]
        # another tenant's namespace closes: its index.kvi (1.5 MiB) written into its own
        # folder, the root left as it was
        grown = 3 * MiB // 2
        tmp = other / "index.kvi.tmp"
        tmp.write_bytes(os.urandom(grown))
        os.rename(tmp, other / INDEX_NAME)
        time.sleep(pool_files.STALE_S + 0.1)
        keys = [b"k%d" % i for i in range(8)]
        for key in keys:
            assert list(tier.put([key], [block(key, size)], [])) == [True]
        stats = tier.stats()
        assert stats["pool_files_bytes"] >= before - 4 * KiB + grown  # it replaced 100 bytes
        # the blocks get the capacity less the pool's own files beyond the allowance
        counted = stats["pool_files_bytes"] - ALLOWANCE
        on_disk = sum(p.stat().st_size for p in (root / NS).rglob("*.kvb"))
        assert stats["pool_bytes"] == on_disk <= cap - counted
        for key, data in zip(keys, tier.get(keys), strict=True):
            assert data is not None and bytes(data) == block(key, size)
    finally:
        tier.close()


def test_a_file_made_in_the_root_is_counted_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new writer's journal (or a rebuilt index) changes the root: the next measure lists
    it again, however long a listing serves otherwise."""
    monkeypatch.setattr(pool_files, "STALE_S", 3600.0)
    root = tmp_path / "pool"
    namespaces(root, 100, 1 * KiB)
    tier = open_backend({"url": str(root), "namespace": NS, "options": {"capacity": 4 * MiB}})
    try:
        assert list(tier.put([b"k"], [block(b"k", 64 * KiB)], [])) == [True]
        time.sleep(0.2)  # the root quiet: a listing serves (for an hour here)
        before = tier.stats()["pool_files_bytes"]
        assert tier.stats()["pool_files_bytes"] == before
        # another writer's journal (pid 1: alive, its journal is left alone)
        Path(journal_path(str(root), "1:feed")).write_bytes(os.urandom(100 * KiB))
        assert tier.stats()["pool_files_bytes"] == before + 100 * KiB + pool_files.JOURNAL_SLACK
    finally:
        tier.close()
