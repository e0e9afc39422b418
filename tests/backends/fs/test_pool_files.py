"""The files of an ``fs`` pool beyond its blocks: a dead writer's temporary files, and
the pool's own files (kvtier.backends.fs.pool_dead, kvtier.backends.fs.pool_db,
docs/shared-capacity.md).

Real processes (tests/support/fs_pool_child.py) on a real 16 MiB tmpfs, where
the filesystem's own count (statvfs) is every byte stored, and on a
loop-mounted ext4, where SQLite's own checkpoints fall behind eight writers;
SIGSTOP and SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fs_blocks import NS
from fs_pool_child import block, open_backend

from kvtier.backends.fs.pool_db import WAL_MAX

log = logging.getLogger("kvtier.tests")
CHILD = Path(__file__).parents[2] / "support" / "fs_pool_child.py"
KiB, MiB = 1 << 10, 1 << 20


def child(spec: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def used(root: Path) -> int:
    """Bytes the tmpfs holds: every file under the root, the pool's own included."""
    st = os.statvfs(root)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def blocks_on_disk(root: Path) -> dict[bytes, int]:
    out = {}
    for folder, _, names in os.walk(root / NS):
        for name in names:
            if name.endswith(".kvb"):
                out[bytes.fromhex(name[:-4])] = os.stat(os.path.join(folder, name)).st_size
    return out


def temporary(root: Path, pid: int) -> list[Path]:
    return list((root / NS).rglob(f".tmp-{pid}-*"))


def test_a_writer_killed_mid_put_leaves_no_uncounted_temporary_file(tmpfs: Path) -> None:
    cap, size = 8 * MiB, 2 * MiB
    opts = {"capacity": cap, "pool_lease": "2s"}
    proc = child({"mode": "churn", "url": str(tmpfs), "namespace": NS, "size": size,
                  "batch": 1, "options": opts})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    rng = random.Random(1)
    for _ in range(2000):  # stop it until it is caught with a block half written
        time.sleep(rng.uniform(0, 0.003))
        proc.send_signal(signal.SIGSTOP)
        if temporary(tmpfs, proc.pid):
            break
        proc.send_signal(signal.SIGCONT)
    left = temporary(tmpfs, proc.pid)
    assert left, "never caught in the middle of a write"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert temporary(tmpfs, proc.pid) == left  # the dead writer's half-written block
    # another process fills the pool: its evictor settles the dead writer, whose credit
    # counted the temporary file until the file is removed with it
    other = open_backend({"url": str(tmpfs), "namespace": NS, "options": opts})
    peak = used(tmpfs)
    try:
        keys = [f"o{i}".encode() for i in range(2 * cap // size)]
        for key in keys:
            assert list(other.put([key], [block(key, size)], [])) == [True]
            peak = max(peak, used(tmpfs))
        assert temporary(tmpfs, proc.pid) == []
        on_disk = blocks_on_disk(tmpfs)
        assert other.stats()["pool_bytes"] == sum(on_disk.values()) <= cap
        assert set(keys[-cap // size:]) <= set(on_disk)
    finally:
        other.close()
    # the blocks (at most the capacity) and the pool's files: no dead writer's file beside
    assert peak <= cap + 1 * MiB, peak


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB ext4 mounted from a file for the test (a disk slower than tmpfs)."""
    image, disk = tmp_path / "ext4.img", tmp_path / "ext4"
    disk.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 * MiB)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True,
                          text=True, check=False)
    if made.returncode:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
    mount = subprocess.run(["mount", "-o", "loop", str(image), str(disk)],
                           capture_output=True, text=True, check=False)
    if mount.returncode:
        pytest.skip(f"mount refused: {mount.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def file_bytes(root: Path) -> tuple[int, int]:
    """Bytes held by every file under ``root`` (blocks, files being written, the pool's
    index, log, shared memory, lock and journals, index.kvi), and those of the pool's
    files alone."""
    total = pool = 0
    for folder, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(FileNotFoundError):  # renamed or deleted since
                held = os.stat(os.path.join(folder, name)).st_blocks * 512
                total += held
                pool += 0 if name.endswith(".kvb") or ".tmp-" in name else held
    return total, pool


#: The bound docs/shared-capacity.md gives for the pool's own files beyond the capacity:
#: the log (WAL_MAX and one transaction), the database and its shared memory (256 KiB
#: for a few hundred blocks), and each writer's journal (64 KiB and a batch's keys).
def pool_files_bound(writers: int) -> int:
    return WAL_MAX + 256 * KiB + writers * 68 * KiB


def test_eight_writers_keep_every_file_within_the_documented_bound(ext4: Path) -> None:
    cap, size, writers = 4 * MiB, 64 * KiB, 8
    spec = {"mode": "write", "url": str(ext4), "namespace": NS, "size": size, "count": 160,
            "writers": writers, "options": {"capacity": cap}}
    procs = [child({**spec, "writer": w}) for w in range(writers)]
    peak, peak_pool, samples = 0, 0, 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, peak_pool, samples
        while not done.is_set():
            total, pool = file_bytes(ext4)
            peak, peak_pool, samples = max(peak, total), max(peak_pool, pool), samples + 1

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        done.set()
        sampler.join()
    for proc, (_, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert sum(r["stored"] for r in reports) == writers * 160  # each wrote 10 MiB
    assert sum(r["read_wrong"] for r in reports) == 0
    assert samples > 20
    log.info("fs pool, %d writers on ext4: peak %d bytes in files (%d of them the pool's "
             "own), capacity %d, %d samples", writers, peak, peak_pool, cap, samples)
    # with SQLite's checkpoints alone the pool's files reached 12.2-12.3 MiB here
    assert peak_pool <= pool_files_bound(writers), (peak_pool, peak)
    assert peak <= cap + pool_files_bound(writers), (peak, peak_pool)
