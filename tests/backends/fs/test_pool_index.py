"""A damaged shared-pool index (``<root>/.kvtier-pool.db``) never stops the tier
(kvtier.backends.fs.pool_db): it is moved aside and rebuilt from the block files.

Two real writer processes (tests/support/fs_pool_child.py) put and read while the
index is damaged under them; no mocks.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fs_blocks import NS, files_on_disk
from fs_pool_child import block, open_backend

import kvtier
from kvtier.backends.fs.pool import DB_NAME

CHILD = Path(__file__).parents[2] / "support" / "fs_pool_child.py"
KiB, MiB = 1 << 10, 1 << 20
CAP, SIZE = 1 * MiB, 16 * KiB


def _index(root: Path) -> Path:
    return Path(os.path.realpath(root / DB_NAME))


def _rot(root: Path) -> None:
    path, rng = _index(root), random.Random(7)
    size = path.stat().st_size
    with open(path, "r+b") as f:  # the header, the first pages, the middle, the end
        for offset in (20, 100, 4096 + 8, size // 2, size - 64):
            f.seek(offset)
            f.write(rng.randbytes(8))


def _truncate(root: Path) -> None:
    path = _index(root)
    os.truncate(path, path.stat().st_size // 3)


def _garbage(root: Path) -> None:
    path = _index(root)
    path.write_bytes(random.Random(3).randbytes(path.stat().st_size))


def _directory(root: Path) -> None:
    os.unlink(_index(root))
    os.unlink(root / DB_NAME) if (root / DB_NAME).is_symlink() else None
    (root / DB_NAME).mkdir()


def _deleted(root: Path) -> None:
    os.unlink(_index(root))


def _garbage_log(root: Path) -> None:
    (root / (DB_NAME + "-wal")).write_bytes(random.Random(5).randbytes(64 * KiB))


FAULTS: dict[str, Callable[[Path], None]] = {
    "bit rot": _rot, "truncated": _truncate, "garbage": _garbage,
    "a directory": _directory, "deleted": _deleted, "garbage log": _garbage_log,
}
#: faults every sharer meets at its next transaction: the file is not the one it opened
#: (damage in the file is met when SQLite reads a page it has not cached, else at an open)
SURE = {"a directory", "deleted"}


def writer(root: Path, w: int, count: int, gate: Path) -> subprocess.Popen[str]:
    spec = {"mode": "write", "url": str(root), "namespace": NS, "size": SIZE, "count": count,
            "writers": 2, "writer": w, "options": {"capacity": CAP}, "gate": str(gate)}
    return subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[dict[str, Any], str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report, err


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_damaged_index_is_rebuilt_while_two_writers_run(tmp_path: Path, fault: str) -> None:
    root, gate = tmp_path / "pool", tmp_path / "go"
    procs = [writer(root, w, 400, gate) for w in range(2)]
    for proc in procs:  # both have the index open, then both put at once
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    gate.touch()
    deadline = time.monotonic() + 120
    # both at work, the index in use by each (keys w<writer>-<i>)
    while min(sum(key.startswith(f"w{w}-".encode()) for key in files_on_disk(root))
              for w in range(2)) < 8:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    FAULTS[fault](root)
    results = [finish(p) for p in procs]
    reports = [r for r, _ in results]
    logs = "".join(err for _, err in results)
    assert sum(r["read_wrong"] for r in reports) == 0
    assert all(r["stored"] > 0 for r in reports)
    rebuilds = sum(r.get("index_rebuilds", 0) for r in reports)
    assert rebuilds <= 1  # one process rebuilt; the other switched to its index
    if fault in SURE:
        assert rebuilds == 1
        assert sum(r.get("index_switches", 0) for r in reports) <= 1
        assert logs.count("is damaged") == 1, logs
        assert f"the index {root / DB_NAME} is damaged" in logs
    # a new process opens the root (a damage left undetected is found now), reads every
    # block exact or as a miss, and holds the capacity over the files already there
    assert (root / DB_NAME).exists()
    tier = open_backend({"url": str(root), "namespace": NS, "options": {"capacity": CAP}})
    try:
        before = files_on_disk(root)
        for key, data in zip(before, tier.get(list(before)), strict=True):
            assert data is None or bytes(data) == block(key, SIZE)
        fresh = [f"after{i}".encode() for i in range(CAP // SIZE)]
        for key in fresh:
            assert list(tier.put([key], [block(key, SIZE)], [])) == [True]
        on_disk = files_on_disk(root)
        assert sum(on_disk.values()) <= CAP
        assert set(fresh) <= set(on_disk)  # the old blocks made way
        assert tier.stats()["pool_bytes"] == sum(on_disk.values())
    finally:
        tier.close()
    kept = list(root.glob(DB_NAME + ".damaged*"))
    assert len([p for p in kept if not p.name.endswith("-wal")]) <= 1  # one copy kept


@pytest.mark.parametrize("fault", ["bit rot", "truncated", "garbage", "a directory"])
def test_a_damaged_index_found_at_open_is_rebuilt(
        tmp_path: Path, fault: str, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "pool"
    first = open_backend({"url": str(root), "namespace": NS, "options": {"capacity": CAP}})
    keys = [f"k{i}".encode() for i in range(16)]
    try:
        assert list(first.put(keys, [block(k, SIZE) for k in keys], [])) == [True] * 16
    finally:
        first.close()
    with sqlite3.connect(root / DB_NAME) as db:  # everything in the file itself
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    FAULTS[fault](root)
    with caplog.at_level(logging.WARNING, logger="kvtier.backends.fs"):
        tier = open_backend({"url": str(root), "namespace": NS, "options": {"capacity": CAP}})
    try:
        warned = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
        assert len(warned) == 1 and str(root / DB_NAME) in warned[0]
        assert tier.stats()["index_rebuilds"] == 1
        got = tier.get(keys)
        assert [bytes(d) for d in got if d is not None] == [block(k, SIZE) for k in keys]
        assert tier.stats()["pool_bytes"] == 16 * SIZE  # counted again from the files
    finally:
        tier.close()
    assert (root / (DB_NAME + ".damaged")).exists()


def test_a_chain_over_a_damaged_index_opens_and_serves(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    namespace = kvtier.Namespace("damaged", dtype="bfloat16", tokens_per_block=16)
    config = {"chain": [{"name": "ram", "backend": "host", "capacity": "4MiB"},
                        {"name": "disk", "backend": "fs", "url": str(root), "capacity": "1MiB"}]}
    keys = [f"c{i}".encode() for i in range(8)]
    with kvtier.open_chain(config, namespace=namespace) as chain:
        assert chain.put(keys, [block(k, SIZE) for k in keys]) == [True] * 8
    _garbage(root)
    with kvtier.open_chain(config, namespace=namespace) as chain:  # its RAM tier empty
        got = chain.get_bytes(keys)
        assert [bytes(d) if d is not None else None for d in got] == [
            block(k, SIZE) for k in keys]
        (disk,) = [t for t in chain.stats()["tiers"] if t["name"] == "disk"]
        assert disk["healthy"] and disk["hits"] == 8
        assert disk["backend_stats"]["index_rebuilds"] == 1


def test_deleting_a_rebuilt_index_leaves_none_of_its_files(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    keys = [f"k{i}".encode() for i in range(4)]
    for step in ("write", "rebuild"):
        tier = open_backend({"url": str(root), "namespace": NS, "options": {"capacity": CAP}})
        try:
            if step == "write":
                assert list(tier.put(keys, [block(k, SIZE) for k in keys], [])) == [True] * 4
            else:
                assert tier.stats()["index_rebuilds"] == 1
        finally:
            tier.close()
        if step == "write":
            _garbage(root)
    generation = os.path.realpath(root / DB_NAME)
    assert (root / DB_NAME).is_symlink() and os.path.exists(generation)
    # another policy is refused while the index records lru: close every process, delete
    # the index (the name the refusal gives), open with the new policy
    os.unlink(root / DB_NAME)
    tier = open_backend({"url": str(root), "namespace": NS,
                         "options": {"capacity": CAP, "eviction": "s3fifo"}})
    try:
        assert tier.stats()["pool_bytes"] == 4 * SIZE
    finally:
        tier.close()
    left = [p.name for p in root.iterdir() if p.name.startswith(os.path.basename(generation))]
    assert left == []  # the rebuilt index, its log and shared memory: no one's any more
