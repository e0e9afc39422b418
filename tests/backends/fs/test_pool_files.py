"""The files of an ``fs`` pool beyond its blocks: a dead writer's temporary files, and
the pool's own files (kvtier.backends.fs.pool_dead, docs/shared-capacity.md).

Real processes (tests/support/fs_pool_child.py) on a real 16 MiB tmpfs, where
the filesystem's own count (statvfs) is every byte stored; SIGSTOP and SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fs_blocks import NS
from fs_pool_child import block, open_backend

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
