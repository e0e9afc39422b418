"""One pool for every process sharing a local ``fs`` root (kvtier.backends.fs.pool).

Real processes (tests/support/fs_pool_child.py), a real tmpfs where the
bytes on disk are sampled, SIGKILL for the evictor; no mocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fs_blocks import NS, files_on_disk
from fs_pool_child import block, open_backend

import kvtier
from kvtier.backends.fs.pool import DB_NAME

CHILD = Path(__file__).parents[2] / "support" / "fs_pool_child.py"

KiB, MiB = 1 << 10, 1 << 20


def child(spec: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def report(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _index_files(root: Path) -> dict[Path, tuple[int, int, int]]:
    """The pool's index files (its database, log and the writers' journals) and the index
    files left at close (none are blocks): each one's inode, change time and bytes held."""
    names = list(root.glob(DB_NAME + "*"))
    names += [p for p in (root / NS).glob("*") if p.is_file()]  # index.kvi and its temp files
    found = {}
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(name)
            found[name] = (st.st_ino, st.st_ctime_ns, st.st_blocks * 512)
    return found


def used_on_tmpfs(root: Path) -> int:
    """Bytes the tmpfs holds in files other than the pool's index, from one statvfs (a
    walk would add files deleted and written while it runs), taken while no index file
    changes: the log grows and is cut back at checkpoints, so equal sizes before and
    after would not show that it was a page longer in between."""
    while True:
        before = _index_files(root)
        st = os.statvfs(root)
        if _index_files(root) == before:
            return (st.f_blocks - st.f_bfree) * st.f_frsize - _index_bytes(before)


def _index_bytes(files: dict[Path, tuple[int, int, int]]) -> int:
    return sum(held for *_, held in files.values())


def rows(root: Path) -> list[tuple[str, bytes, int, str]]:
    with sqlite3.connect(root / DB_NAME, timeout=30) as db:
        return db.execute("SELECT ns, key, size, state FROM blocks").fetchall()


@pytest.mark.parametrize("eviction", ["lru", "s3fifo"])
def test_four_writers_keep_one_capacity(tmpfs: Path, eviction: str) -> None:
    cap, size = 4 * MiB, 64 * KiB  # whole pages: the tmpfs holds exactly the bytes written
    spec = {"mode": "write", "url": str(tmpfs), "namespace": NS, "size": size,
            "count": 160, "writers": 4, "options": {"capacity": cap, "eviction": eviction}}
    # a fifth sharer, idle, so that no writer's close is the last one: the last
    # deletes the index's log, which a writer opening then may still hold (freed
    # space the sampling could not see)
    watcher = open_backend(spec)
    try:
        procs = [child({**spec, "writer": w}) for w in range(4)]
        peak = 0
        while any(p.poll() is None for p in procs):
            peak = max(peak, used_on_tmpfs(tmpfs))
        reports = [report(p) for p in procs]
        peak = max(peak, used_on_tmpfs(tmpfs))
    finally:
        watcher.close()
    # each wrote 10 MiB: without the pool the directory held up to 4 x the capacity
    assert sum(r["stored"] for r in reports) == 4 * 160
    assert peak <= cap  # the documented bound: nothing beyond the capacity, in flight or not
    assert sum(r["read_wrong"] for r in reports) == 0
    assert sum(r["read_exact"] for r in reports) > 0
    assert max(r["pool_evictions"] for r in reports) > 0
    # the index counts exactly the files left, all stored
    on_disk = files_on_disk(tmpfs)
    assert {key: size for _, key, size, _ in rows(tmpfs)} == on_disk
    assert {state for *_, state in rows(tmpfs)} == {"S"}
    assert sum(on_disk.values()) <= cap


@pytest.mark.parametrize("eviction", ["lru", "s3fifo"])
def test_a_killed_evictor_is_replaced_and_leaves_nothing_uncounted(
        tmp_path: Path, eviction: str) -> None:
    root, size, batch = tmp_path / "pool", 1 * KiB, 600
    opts = {"capacity": batch * size, "pool_lease": "30s", "eviction": eviction}
    spec = {"mode": "churn", "url": str(root), "namespace": NS, "size": size, "batch": batch,
            "options": opts}
    proc = child(spec)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    # every later batch evicts the one before: kill the evictor between marking its
    # victims and deleting the last of them
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, "never caught the evictor at work"
        with sqlite3.connect(root / DB_NAME, timeout=30) as db:
            doomed = db.execute("SELECT COUNT(*) FROM blocks WHERE state = 'D'").fetchone()[0]
            holder = db.execute("SELECT holder FROM lease").fetchone()[0]
        if doomed > 100 and holder.startswith(f"{proc.pid}:"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=30)
    left = [r for r in rows(root) if r[3] == "D"]
    assert left, "killed after the eviction finished"
    # another process needs room: the lease's holder is dead, so it takes over at once
    # (a holder alive but stuck would be replaced when the lease expires)
    other = open_backend({"url": str(root), "namespace": NS, "options": opts})
    try:
        assert list(other.put([b"after"], [block(b"after", size)], [])) == [True]
        assert other.stats()["pool_bytes"] <= batch * size
    finally:
        other.close()
    after = rows(root)
    assert {r[3] for r in after} == {"S"}  # no victim left half deleted, no write unsettled
    on_disk = files_on_disk(root)
    assert {key: s for _, key, s, _ in after} == on_disk  # nothing uncounted
    assert b"after" in on_disk
    # reopened: every block is whole, or a miss
    again = open_backend({"url": str(root), "namespace": NS, "options": opts})
    try:
        keys = list(files_on_disk(root))
        assert keys
        for key, data in zip(keys, again.get(keys), strict=True):
            assert data is not None and bytes(data) == block(key, size)
        assert again.stats()["pool_bytes"] == sum(files_on_disk(root).values())
    finally:
        again.close()


def test_min_free_keeps_a_small_tmpfs_from_filling(tmpfs: Path) -> None:
    floor, size = 6 * MiB, 64 * KiB
    tier = open_backend({"url": str(tmpfs), "namespace": NS, "options": {"min_free": "6MiB"}})
    try:
        keys = [f"f{i}".encode() for i in range(160)]  # 10 MiB into 16: some must go
        for key in keys:
            assert list(tier.put([key], [block(key, size)], [])) == [True]
            st = os.statvfs(tmpfs)
            assert st.f_bavail * st.f_frsize + _index_bytes(_index_files(tmpfs)) >= floor
        assert tier.stats()["pool_evictions"] > 0
        kept = [k for k, d in zip(keys, tier.get(keys), strict=True) if d is not None]
        assert len(kept) < len(keys)
        # another program fills the disk below the floor: less is stored than would
        # make room, so puts are refused (no error), and what is stored stays readable
        assert tier.evict(kept[:-8]) == [True] * (len(kept) - 8)
        st = os.statvfs(tmpfs)
        filler = st.f_bavail * st.f_frsize - 5 * MiB
        (tmpfs / "other-program").write_bytes(b"\0" * filler)
        fresh = [f"g{i}".encode() for i in range(4)]
        assert list(tier.put(fresh, [block(k, size) for k in fresh], [])) == [False] * 4
        assert tier.stats()["pool_refused"] == 4
        for key, data in zip(kept[-8:], tier.get(kept[-8:]), strict=True):
            assert data is not None and bytes(data) == block(key, size)
    finally:
        tier.close()


def test_two_namespaces_stay_within_the_pool_budget(tmp_path: Path) -> None:
    root, cap, size = tmp_path / "pool", 2 * MiB, 64 * KiB
    other_ns = "fedcba9876543210fedcba9876543210"
    spec = {"mode": "write", "url": str(root), "size": size, "count": 64, "writers": 1,
            "writer": 0, "options": {"capacity": cap, "capacity_scope": "pool"}}
    procs = [child({**spec, "namespace": ns}) for ns in (NS, other_ns)]
    reports = [report(p) for p in procs]
    assert [r["stored"] for r in reports] == [64, 64]
    assert sum(r["read_wrong"] for r in reports) == 0
    held = [sum(files_on_disk(root, ns).values()) for ns in (NS, other_ns)]
    assert sum(held) <= cap  # each namespace wrote 4 MiB, twice the budget of both
    with sqlite3.connect(root / DB_NAME) as db:
        assert db.execute("SELECT bytes FROM totals WHERE scope = '*'").fetchone()[0] == sum(held)


def test_block_removed_once_for_every_victim_whoever_wrote_it(tmp_path: Path) -> None:
    root, size = tmp_path / "pool", 16 * KiB
    tier = {"capacity": "1MiB", "direct_io": False}
    removed: list[bytes] = []

    def listen(event: kvtier.ChainEvent) -> None:
        if event.kind == "removed":
            assert event.reason == "capacity"
            removed.extend(event.keys)

    namespace = kvtier.Namespace("events", dtype="bfloat16", tokens_per_block=16)
    config = {"chain": [{"name": "disk", "backend": "fs", "url": str(root), **tier}]}
    mine = [f"p{i}".encode() for i in range(64)]
    with kvtier.open_chain(config, namespace=namespace) as chain:
        chain.add_listener(listen)
        # another process writes while this chain is open (it never reads them)
        writer = child({"mode": "chain", "url": str(root), "model": "events", "prefix": "w",
                        "count": 40, "size": size, "options": tier})
        theirs = [k.encode() for k in report(writer)["stored"]]
        assert len(theirs) == 40
        for key in mine:
            assert chain.put([key], [block(key, size)]) == [True]
        held = {k for k, at in zip(theirs + mine, chain.lookup(theirs + mine), strict=True)
                if at is not None}
    counts = Counter(removed)
    assert set(counts.values()) == {1}  # each once
    assert set(counts) == set(theirs + mine) - held  # every block gone, and only those
    assert set(theirs) <= set(counts)  # the other process's blocks too


def test_reads_and_puts_from_the_credit_wait_for_no_transaction(tmp_path: Path) -> None:
    root, size = tmp_path / "pool", 16 * KiB
    tier = open_backend({"url": str(root), "namespace": NS, "options": {"capacity": "8MiB"}})
    try:
        first = [f"a{i}".encode() for i in range(4)]
        assert list(tier.put(first, [block(k, size) for k in first], [])) == [True] * 4
        # another process holds the index's write lock: reads and the puts the
        # credit covers (1/16 of the capacity) go on without it
        with sqlite3.connect(root / DB_NAME, timeout=30, isolation_level=None) as lock:
            lock.execute("BEGIN IMMEDIATE")
            got = tier.get(first)
            assert [bytes(d) for d in got if d is not None] == [block(k, size) for k in first]
            more = [f"b{i}".encode() for i in range(8)]
            for key in more:
                assert list(tier.put([key], [block(key, size)], [])) == [True]
            assert [bytes(d) for d in tier.get(more) if d is not None] == [
                block(k, size) for k in more]
            lock.execute("ROLLBACK")
    finally:
        tier.close()
    on_disk = files_on_disk(root)
    assert set(on_disk) == set(first + more)
    assert {key: s for _, key, s, _ in rows(root)} == on_disk  # every write has its row
    with sqlite3.connect(root / DB_NAME) as db:
        assert db.execute("SELECT bytes, inflight FROM totals WHERE scope = '*'").fetchone() == (
            sum(on_disk.values()), 0)
        assert db.execute("SELECT COUNT(*) FROM writers").fetchone()[0] == 0


def test_a_killed_writer_s_credit_writes_are_counted_from_its_journal(tmp_path: Path) -> None:
    root, size, cap = tmp_path / "pool", 16 * KiB, 8 * MiB
    spec = {"mode": "credit", "url": str(root), "namespace": NS, "size": size, "count": 10,
            "options": {"capacity": cap}}
    # open first: the files at open are counted anyway (adopt), those written later not
    other = open_backend({"url": str(root), "namespace": NS, "options": {"capacity": cap}})
    try:
        proc = child(spec)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        stored = [k.encode() for k in json.loads(line)["stored"]]
        assert len(stored) == 10  # written from the credit while the index was locked
        assert set(stored) <= set(files_on_disk(root))
        assert not set(stored) & {key for _, key, _, _ in rows(root)}  # no row made for them
        # the other process needs more room than is left: its evictor settles the dead
        # writer first, counting the files its journal names and giving back its credit
        keys = [f"o{i}".encode() for i in range(cap // size)]
        assert all(other.put(keys, [block(k, size) for k in keys], []))
        assert other.stats()["pool_evictions"] > 0
    finally:
        other.close()
    on_disk = files_on_disk(root)
    assert {key: s for _, key, s, _ in rows(root)} == on_disk  # nothing uncounted
    assert sum(on_disk.values()) <= cap
    with sqlite3.connect(root / DB_NAME) as db:
        assert db.execute("SELECT bytes, inflight FROM totals WHERE scope = '*'").fetchone() == (
            sum(on_disk.values()), 0)
        assert db.execute("SELECT COUNT(*) FROM writers").fetchone()[0] == 0
    assert list(root.glob(DB_NAME + ".writer-*")) == []  # its journal removed
    again = open_backend({"url": str(root), "namespace": NS, "options": {"capacity": cap}})
    try:
        for key, data in zip(on_disk, again.get(list(on_disk)), strict=True):
            assert data is not None and bytes(data) == block(key, size)
    finally:
        again.close()


def test_a_file_held_open_gives_its_room_back_when_evicted(tmpfs: Path) -> None:
    cap, size = 4 * 64 * KiB, 64 * KiB
    tier = open_backend({"url": str(tmpfs), "namespace": NS, "options": {"capacity": cap}})
    try:
        old = [f"old{i}".encode() for i in range(4)]
        assert list(tier.put(old, [block(k, size) for k in old], [])) == [True] * 4
        # a program keeps one block open (a slow reader, a backup): unlinked only, its
        # bytes would stay on the disk beside the blocks that took its room
        held = os.open(tier.instance._store.path(old[0]), os.O_RDONLY)
        try:
            new = [f"new{i}".encode() for i in range(4)]
            for key in new:
                assert list(tier.put([key], [block(key, size)], [])) == [True]
            assert files_on_disk(tmpfs).keys() == set(new)
            assert used_on_tmpfs(tmpfs) <= cap
            assert os.read(held, size) == b""  # truncated: nothing of it is left
        finally:
            os.close(held)
    finally:
        tier.close()


def test_a_read_that_overlaps_its_block_s_eviction_is_a_miss(tmp_path: Path) -> None:
    size = 16 * KiB
    tier = open_backend({"url": str(tmp_path), "namespace": NS, "options": {"capacity": "1MiB"}})
    try:
        store, capacity = tier.instance._store, tier.instance._capacity
        keys = [b"a", b"b"]
        assert list(tier.put(keys, [block(k, size) for k in keys], [])) == [True, True]
        opened = store._open

        def evicted_once_open(key: bytes) -> int | None:
            fd = opened(key)  # the read has the file open: the evictor takes it now
            assert capacity.remove_victim((NS, key))
            return fd

        store._open = evicted_once_open
        # truncated under the read: what it reads is empty (or zeros), never a block
        assert list(tier.get([b"a"])) == [None]
        buf = bytearray(size)
        assert list(tier.get_into([b"b"], [[memoryview(buf)]])) == [None]
        del store._open
        assert list(tier.get(keys)) == [None, None]  # gone, as a miss
    finally:
        tier.close()


def test_opening_waits_while_another_process_holds_the_new_index(tmp_path: Path) -> None:
    root, size = tmp_path / "pool", 16 * KiB
    root.mkdir()
    # another process is creating the index (it holds the file's lock before its
    # log is switched to WAL): an open at that moment waits for it, as a
    # transaction would, instead of failing the tier
    with sqlite3.connect(root / DB_NAME, timeout=30, isolation_level=None,
                         check_same_thread=False) as lock:
        lock.execute("BEGIN EXCLUSIVE")
        lock.execute("CREATE TABLE being_made (x)")
        release = threading.Timer(0.5, lambda: lock.execute("COMMIT"))
        release.start()
        try:
            tier = open_backend({"url": str(root), "namespace": NS,
                                 "options": {"capacity": "1MiB"}})
        finally:
            release.join()
    try:
        keys = [b"a", b"b"]
        assert list(tier.put(keys, [block(k, size) for k in keys], [])) == [True, True]
        assert [bytes(d) for d in tier.get(keys) if d is not None] == [block(k, size)
                                                                       for k in keys]
    finally:
        tier.close()


def test_a_put_waits_for_another_process_s_eviction_that_ends_before_it_looks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = 64 * KiB
    tier = open_backend({"url": str(tmp_path), "namespace": NS,
                         "options": {"capacity": 4 * size}})
    try:
        old = [f"old{i}".encode() for i in range(4)]
        assert list(tier.put(old, [block(k, size) for k in old], [])) == [True] * 4
        pool = tier.instance._capacity.pool
        take, tries = pool.evictor.take_lease, []

        def held_by_another() -> bool:
            # another process holds the lease at the first try, and has given it
            # back by the time this one looks again (nothing of anyone's in flight)
            tries.append(time.monotonic())
            return len(tries) > 1 and take()

        monkeypatch.setattr(pool.evictor, "take_lease", held_by_another)
        monkeypatch.setattr(pool.evictor, "lease_held", lambda db: False)
        new = [b"new0", b"new1"]
        assert list(tier.put(new, [block(k, size) for k in new], [])) == [True, True]
        assert pool.refused == 0 and len(tries) == 2
        assert [bytes(d) for d in tier.get(new) if d is not None] == [block(k, size)
                                                                      for k in new]
    finally:
        tier.close()
