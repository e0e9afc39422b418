"""The ``fs`` tier's ``eviction: s3fifo``, in the shared pool (SQL) and in the per-process ledger.

Each path is checked against :class:`kvtier.policies.S3Fifo` fed the
same admits and uses: the same victims, in the same order, and the same
blocks left on disk, read back byte for byte.  Real files and a real
SQLite index; the second process is a real one.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from fs_blocks import NS, Opener, as_bytes, blob
from fs_pool_child import block

from kvtier.backends.fs.pool import DB_NAME
from kvtier.policies import S3Fifo
from kvtier.spec import BytesLike
from kvtier.testing.capacity import CapacityTests

#: 48,000 bytes hold 9 to 15 blocks; a sixteenth (3,000) is under the smallest block, so
#: the pool takes no credit ahead and evicts exactly when S3Fifo would.
CAP = 48_000
SIZES = (3_100, 4_000, 5_200)
PATHS = {"pool": {"pool": True}, "ledger": {"pool": False}}


def open_tier(opener: Opener, url: str, path: str, eviction: str) -> Any:
    return opener(url, capacity=CAP, eviction=eviction, io_threads=1, direct_io=False,
                  **PATHS[path])


def on_disk(url: str) -> set[bytes]:
    root = Path(url.removeprefix("file://")) / NS
    return {bytes.fromhex(p.name[:-4]) for p in root.rglob("*.kvb")}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("seed", [0, 1])
def test_victims_are_s3fifo_s(local_url: str, opener: Opener, path: str, seed: int) -> None:
    tier = open_tier(opener, local_url, path, "s3fifo")
    model = S3Fifo(CAP)
    rng = random.Random(seed)
    data: dict[bytes, bytes] = {}  # every key ever put -> its bytes
    hot = [f"hot-{i}".encode() for i in range(4)]
    evictions = ghost_hits = 0
    for step in range(400):
        roll = rng.random()
        if roll < 0.45 or not data:
            key = rng.choice(hot) if rng.random() < 0.3 else f"cold-{step}".encode()
            if rng.random() < 0.25 and data:  # a key put before, evicted since
                key = rng.choice(sorted(data))
            if model.size(key) is not None:
                continue  # a put of a key held is no admit: left out
            data.setdefault(key, blob(rng.choice(SIZES), step))
            ghost_hits += key in model._ghosts.keys
            want = model.admit(key, len(data[key]))
            got: list[tuple[bytes, BytesLike]] = []
            assert tier.put([key], [data[key]], got) == [True]
            assert [k for k, _ in got] == want, f"step {step}"
            assert all(bytes(v) == data[k] for k, v in got)
            evictions += len(got)
        else:
            key = rng.choice(hot + sorted(data))
            held = model.access(key)
            assert (as_bytes(tier.get([key])[0]) == data.get(key)) if held else \
                tier.get([key]) == [None], f"step {step}: {key!r}"
    assert evictions > 50 and ghost_hits > 5  # the sequence did exercise S, M and the ghosts
    held = {key for key, _ in model.held()}
    assert on_disk(local_url) == held
    assert all(as_bytes(tier.get([key])[0]) == data[key] for key in sorted(held))


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("eviction", ["lru", "s3fifo"])
def test_a_hot_set_survives_a_scan_under_s3fifo_only(
        local_url: str, opener: Opener, path: str, eviction: str) -> None:
    tier = open_tier(opener, local_url, path, eviction)
    size = 4_000  # 12 blocks fill the capacity
    hot = [f"hot-{i}".encode() for i in range(3)]
    assert tier.put(hot, [block(key, size) for key in hot], []) == [True] * 3
    reads = []
    for n in range(60):  # 240,000 bytes of one-off blocks: five times the capacity
        if n % 15 == 0:  # the hot set is read again, but 15 blocks (60,000 bytes) apart
            reads.append([as_bytes(b) for b in tier.get(hot)])
        key = f"scan-{n}".encode()
        assert tier.put([key], [block(key, size)], []) == [True]
    reads.append([as_bytes(b) for b in tier.get(hot)])
    if eviction == "s3fifo":
        assert reads == [[block(key, size) for key in hot]] * 5
        assert set(hot) <= on_disk(local_url)
    else:  # read once, then flushed by the 15 blocks before the next read
        assert reads == [[block(key, size) for key in hot]] + [[None] * len(hot)] * 4
        assert not set(hot) & on_disk(local_url)


_OTHER = textwrap.dedent("""
    import sys
    from kvtier.plugins.registry import default_registry
    from kvtier.spec import ConfigError
    handle = default_registry().create("fs")
    try:
        handle.open({"url": sys.argv[1], "capacity": 48000, "eviction": "lru"}, sys.argv[2])
    except ConfigError as exc:
        print("ConfigError", exc)
    else:
        print("opened")
        handle.close()
""")


def test_a_second_process_with_another_policy_is_refused(local_url: str, opener: Opener) -> None:
    tier = open_tier(opener, local_url, "pool", "s3fifo")
    assert tier.put([b"a"], [b"x" * 3_100], []) == [True]
    out = subprocess.run([sys.executable, "-c", _OTHER, local_url, NS], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.startswith("ConfigError"), out
    assert "evicts by s3fifo" in out and "eviction: s3fifo" in out
    assert as_bytes(tier.get([b"a"])[0]) == b"x" * 3_100  # the first one is unharmed


def test_an_index_from_before_the_policy_is_migrated(local_url: str, opener: Opener) -> None:
    """An index written without the policy's columns opens under s3fifo, its rows in S in
    the order of their last use, and evicts them in that order."""
    first = open_tier(opener, local_url, "pool", "lru")
    keys = [f"old-{i}".encode() for i in range(4)]
    for key in keys:
        assert first.put([key], [block(key, 4_000)], []) == [True]
    first.get([keys[0]])  # the most recent now
    first.close()
    db_path = Path(local_url.removeprefix("file://")) / DB_NAME
    with sqlite3.connect(db_path) as db:  # back to the previous version's index
        columns = [row[1] for row in db.execute("PRAGMA table_info(blocks)")]
        assert columns == ["ns", "key", "size", "state", "writer", "used"]  # lru kept them
        db.execute("DROP TABLE meta")
        db.execute("DROP TABLE ghosts")
    tier = open_tier(opener, local_url, "pool", "s3fifo")
    got: list[tuple[bytes, BytesLike]] = []
    for n in range(9):  # 13 blocks of 4,000 bytes: one more than the capacity
        key = f"new-{n}".encode()
        assert tier.put([key], [block(key, 4_000)], got) == [True]
    assert [k for k, _ in got] == [keys[1]]  # the least recently used went first
    assert all(as_bytes(tier.get([k])[0]) == block(k, 4_000) for k in (keys[0], *keys[2:]))


class TestFsS3FifoPool(CapacityTests):
    backend = "fs"

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"url": f"file://{tmp_path}/fs", "capacity": "12MiB", "eviction": "s3fifo"}


class TestFsS3FifoLedger(CapacityTests):
    backend = "fs"

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"url": f"file://{tmp_path}/fs", "capacity": "12MiB", "eviction": "s3fifo",
                "pool": False}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_sizing_miniatures_run_the_tier_s_policy(
        local_url: str, opener: Opener, path: str) -> None:
    tier = open_tier(opener, local_url, path, "s3fifo")
    assert tier.capabilities().eviction == "s3fifo"
    assert tier.put([b"k"], [b"v" * 3_100], []) == [True]  # the miniatures start here
    sizer = tier.instance._sizing._sizer
    assert sizer is not None and sizer.eviction == "s3fifo"
    assert {type(mini) for mini in sizer._minis} == {S3Fifo}
