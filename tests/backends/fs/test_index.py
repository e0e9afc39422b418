"""The fs tier's persistent index: right after a clean close, after a crash, and after
files changed behind its back; never a source of data."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash
from fs_blocks import NS, open_fs

from kvtier.backends.fs import index as fs_index
from kvtier.plugins.registry import BackendHandle


def blob(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def leaves(root: Path) -> list[Path]:
    return sorted(p for p in (root / NS).glob("*/*") if p.is_dir())


def age_leaves(root: Path, seconds: float = 60.0) -> None:
    """Backdate every leaf directory, as if its last change were long before the close.

    A leaf changed within a clock tick (two seconds, to be safe) of the index
    being written is never trusted, and in a test everything is that recent.
    """
    then = time.time() - seconds
    for leaf in leaves(root):
        os.utime(leaf, (then, then))


def stats(handle: BackendHandle) -> dict[str, Any]:
    return dict(handle.stats())


KEYS = [bytes([i, 255 - i]) + b"-block" for i in range(40)] + [b"\x07"]  # a 1-byte key too
BLOCKS = [blob(100 + 37 * i, i) for i in range(len(KEYS))]


def test_clean_close_reopens_from_the_index_in_lru_order(
    tmp_path: Path, handles: list[BackendHandle]
) -> None:
    tier = open_fs(tmp_path, handles)
    assert all(tier.put(KEYS, BLOCKS, []))
    assert [bytes(b) for b in tier.get(KEYS[:5])] == BLOCKS[:5]  # now the most recently used
    age_leaves(tmp_path)
    tier.close()
    assert (tmp_path / NS / "index.kvi").is_file()
    again = open_fs(tmp_path, handles, capacity=sum(map(len, BLOCKS)))
    s = stats(again)
    assert s["leaves_rescanned"] == 0, "nothing changed: every leaf trusted"
    assert s["blocks"] == len(KEYS) and s["used_bytes"] == sum(map(len, BLOCKS))
    assert list(again.lookup(KEYS)) == [True] * len(KEYS)
    # the order of use survived: the first evicted are those not read last
    evicted: list[tuple[bytes, Any]] = []
    assert all(again.put([b"zz-new"], [blob(len(BLOCKS[5]) + len(BLOCKS[6]), 99)], evicted))
    assert [k for k, _ in evicted] == [KEYS[5], KEYS[6]]
    assert [bytes(v) for _, v in evicted] == [BLOCKS[5], BLOCKS[6]]


def test_after_a_crash_the_changed_leaves_are_rescanned(
    tmp_path: Path, handles: list[BackendHandle]
) -> None:
    tier = open_fs(tmp_path, handles)
    assert all(tier.put(KEYS[:20], BLOCKS[:20], []))
    age_leaves(tmp_path)
    tier.close()
    crashed = open_fs(tmp_path, handles)
    # writes and deletes after the index was saved, then no close (a crash)
    assert all(crashed.put(KEYS[20:], BLOCKS[20:], []))
    assert list(crashed.evict(KEYS[:3])) == [True] * 3
    again = open_fs(tmp_path, handles)
    s = stats(again)
    assert 0 < s["leaves_rescanned"] < len(leaves(tmp_path))
    assert s["blocks"] == len(KEYS) - 3
    assert s["used_bytes"] == sum(map(len, BLOCKS[3:]))
    assert list(again.lookup(KEYS)) == [False] * 3 + [True] * (len(KEYS) - 3)
    assert [bytes(b) for b in again.get(KEYS[3:])] == BLOCKS[3:]


def test_files_changed_behind_its_back(tmp_path: Path, handles: list[BackendHandle]) -> None:
    tier = open_fs(tmp_path, handles)
    assert all(tier.put(KEYS, BLOCKS, []))
    age_leaves(tmp_path)
    tier.close()
    store = tier.instance._store
    # another program deletes one block, and copies in another
    gone = Path(store.path(KEYS[0]))
    gone.unlink()
    extra = b"\x00\xffextra"
    (tmp_path / NS / "00" / "ff").mkdir(parents=True, exist_ok=True)
    Path(store.path(extra)).write_bytes(b"x" * 321)
    again = open_fs(tmp_path, handles)
    s = stats(again)
    assert s["blocks"] == len(KEYS)  # one gone, one new
    assert s["used_bytes"] == sum(map(len, BLOCKS[1:])) + 321
    assert list(again.lookup([KEYS[0], extra])) == [False, True]


def test_a_hidden_deletion_is_a_miss_not_data(
    tmp_path: Path, handles: list[BackendHandle]
) -> None:
    """A deletion the index cannot see (its directory's mtime put back) costs a miss."""
    tier = open_fs(tmp_path, handles)
    assert all(tier.put(KEYS, BLOCKS, []))
    age_leaves(tmp_path)
    tier.close()
    gone = Path(tier.instance._store.path(KEYS[1]))
    st = gone.parent.stat()
    gone.unlink()
    os.utime(gone.parent, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = open_fs(tmp_path, handles)
    assert stats(again)["leaves_rescanned"] == 0
    assert again.get([KEYS[1]])[0] is None
    assert bytes(again.get([KEYS[2]])[0]) == BLOCKS[2]
    # the miss set the index right
    assert stats(again)["used_bytes"] == sum(map(len, BLOCKS)) - len(BLOCKS[1])


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "empty"])
def test_a_damaged_index_means_a_full_scan(
    tmp_path: Path, handles: list[BackendHandle], damage: str
) -> None:
    tier = open_fs(tmp_path, handles)
    assert all(tier.put(KEYS, BLOCKS, []))
    age_leaves(tmp_path)
    tier.close()
    path = tmp_path / NS / "index.kvi"
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        data[len(data) // 3] ^= 0x10
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    again = open_fs(tmp_path, handles)
    s = stats(again)
    assert s["leaves_rescanned"] == -1  # not trusted at all: the tree was walked
    assert s["blocks"] == len(KEYS) and s["used_bytes"] == sum(map(len, BLOCKS))


def test_an_index_with_a_key_in_the_wrong_leaf_is_refused(tmp_path: Path) -> None:
    """The check that keeps a hand-made index from hiding keys from every rescan."""
    (tmp_path / NS).mkdir(parents=True)
    store = fs_index.LocalStore(str(tmp_path / NS))
    fs_index.save_index(store, [b"\x01\x02key"], [10], lambda f, xs: [f(x) for x in xs], False)
    path = tmp_path / NS / "index.kvi"
    assert fs_index.load_index(store, lambda f, xs: [f(x) for x in xs]) is not None
    body = bytearray(path.read_bytes()[:-8])
    body[-7] ^= 1  # the key's first byte: now it belongs in another leaf
    path.write_bytes(bytes(body) + xxhash.xxh3_64_digest(bytes(body)))
    assert fs_index.load_index(store, lambda f, xs: [f(x) for x in xs]) is None
