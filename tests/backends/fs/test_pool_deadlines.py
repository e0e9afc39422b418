"""Deadlines (``kvtier_expire``) on the ``fs`` tier, on real files: a block past its
deadline is a miss and its file goes, for this process and for another one on the shared
pool (a row of the index); a deadline leaves with its block, so a block stored again is not
expired by it; without the pool the deadline holds in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fs_blocks import as_bytes, blob, files_on_disk, open_fs

from kvtier.backends.fs.expiry import POLL_S
from kvtier.plugins.registry import BackendHandle

SIZE = 8 << 10
NS = "d" * 32
SUPPORT = Path(__file__).parents[2] / "support"
POOLED: dict[str, Any] = {"capacity": 64 * SIZE, "capacity_scope": "pool", "direct_io": False}


def key(i: int) -> bytes:
    return b"deadline-%04d" % i


def put(handle: BackendHandle, ids: range | list[int]) -> None:
    keys = [key(i) for i in ids]
    assert handle.put(keys, [blob(SIZE, i) for i in ids], []) == [True] * len(keys)


def exact(handle: BackendHandle, ids: range | list[int]) -> list[int]:
    """The ids read back; a wrong byte fails the test."""
    out = []
    for i, data in zip(ids, handle.get([key(i) for i in ids]), strict=True):
        if data is not None:
            assert as_bytes(data) == blob(SIZE, i), i
            out.append(i)
    return out


def test_a_block_past_its_deadline_is_a_miss_and_its_file_goes(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    t = open_fs(tmp_path, handles, NS, **POOLED)
    put(t, range(4))
    before = time.monotonic()
    assert t.expire([key(1), key(2), key(99)], 0.5) == [True, True, None]
    start = time.monotonic()  # the deadline is no later than start + after
    if time.monotonic() - before < 0.4:  # before the deadline: exact
        assert exact(t, range(4)) == [0, 1, 2, 3]
    time.sleep(max(0.0, start + 0.6 - time.monotonic()))
    assert exact(t, range(4)) == [0, 3]
    assert t.lookup([key(1), key(2)]) == [False, False]
    assert not {key(1), key(2)} & set(files_on_disk(tmp_path, NS))
    stats = dict(t.stats())
    assert stats["expired"] == 2
    assert stats["blocks"] == 2


def test_a_later_deadline_does_not_put_off_an_earlier_one_nor_the_tier_s_expire(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    t = open_fs(tmp_path, handles, NS, expire="1.5s", **POOLED)
    put(t, range(3))
    assert t.expire([key(0)], 0.3) == [True]
    start = time.monotonic()  # the deadline is no later than start + after
    assert t.expire([key(0)], 3600) == [True]  # the earlier stays
    assert t.expire([key(1)], 3600) == [True]  # never past the tier's own expire
    time.sleep(max(0.0, start + 0.5 - time.monotonic()))
    assert exact(t, range(3)) == [1, 2]
    time.sleep(max(0.0, start + 1.6 - time.monotonic()))
    assert exact(t, range(3)) == []


_EXPIRE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from fs_blocks import open_fs
from pathlib import Path
spec = json.loads(sys.argv[2])
handles = []
t = open_fs(Path(spec["root"]), handles, spec["ns"], **spec["options"])
print(json.dumps(t.expire([k.encode() for k in spec["keys"]], spec["after"])))
t.close()
"""


def expire_elsewhere(root: Path, keys: list[bytes], after: float) -> list[bool | None]:
    """``kvtier_expire`` by another process, on its own instance of the root."""
    spec = {"root": str(root), "ns": NS, "options": POOLED, "after": after,
            "keys": [k.decode() for k in keys]}
    done = subprocess.run([sys.executable, "-c", _EXPIRE, str(SUPPORT), json.dumps(spec)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr
    answer: list[bool | None] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_a_deadline_another_process_set_expires_the_block_here(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    here = open_fs(tmp_path, handles, NS, **POOLED)
    put(here, range(4))
    assert exact(here, range(4)) == [0, 1, 2, 3]  # seen here: in this process's clock
    asked = time.monotonic()
    assert expire_elsewhere(tmp_path, [key(0), key(2), key(50)], 1.0) == [True, True, None]
    done = time.monotonic()  # the deadline is no later than done + 1 s
    assert exact(here, range(4)) == [0, 1, 2, 3] or time.monotonic() - asked > 1.0
    # past the deadline, this process's gets miss them within a look at the index or two
    # (a look waits while a transaction of this process holds the index: POLL_S / 2)
    time.sleep(max(0.0, done + 1.0 - time.monotonic()))
    while exact(here, range(4)) != [1, 3]:
        assert time.monotonic() < done + 1.0 + 2 * POLL_S + 0.5, "the deadline never held here"
        time.sleep(0.05)
    assert not {key(0), key(2)} & set(files_on_disk(tmp_path, NS))


def test_a_deadline_leaves_with_its_block_a_block_stored_again_has_none(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    first = open_fs(tmp_path, handles, NS, **POOLED)
    put(first, range(2))
    assert expire_elsewhere(tmp_path, [key(0)], 0.5) == [True]
    assert first.evict([key(0)]) == [True]  # its row goes, and the deadline's with it
    put(first, [0])  # stored again: a new block
    time.sleep(0.6)
    # a new instance reads every deadline of the index: none is left for the new block
    fresh = open_fs(tmp_path, handles, NS, **POOLED)
    assert exact(fresh, [0, 1]) == [0, 1]
    assert exact(first, [0, 1]) == [0, 1]


def test_without_the_pool_a_deadline_holds_in_its_process(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    t = open_fs(tmp_path, handles, NS, capacity_scope="process", direct_io=False)
    put(t, range(2))
    assert t.expire([key(0), key(7)], 0.3) == [True, None]
    start = time.monotonic()  # the deadline is no later than start + after
    time.sleep(max(0.0, start + 0.4 - time.monotonic()))
    assert exact(t, range(2)) == [1]
    assert key(0) not in set(files_on_disk(tmp_path, NS))
