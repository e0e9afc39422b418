"""``read_only: true``: the ``fs`` backend reads a root and writes nothing under it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fs_blocks import NS, Opener, as_bytes, blob

from kvtier.backends.fs.pool import DB_NAME
from kvtier.spec import ConfigError

KEYS = [b"a" * 8, b"b" * 8, bytes(range(64))]
# 300 KiB: a block above the size that is read with O_DIRECT where it may
BLOCKS = [blob(100, 1), blob(5000, 2), blob(300 << 10, 3)]


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and mtime (ns), directories included."""
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in [root, *root.rglob("*")]}


@pytest.mark.parametrize("pooled", [False, True], ids=["plain", "pooled"])
def test_reads_exact_and_writes_nothing(local_url: str, opener: Opener, pooled: bool) -> None:
    root = Path(local_url.removeprefix("file://"))
    bound = {"capacity": 64 << 20} if pooled else {}
    writer = opener(local_url, **bound)
    assert list(writer.put(KEYS, BLOCKS, [])) == [True] * 3
    writer.close()
    other = "f" * 32  # a namespace never written: it has no directory
    before = tree(root)
    assert (str(root / DB_NAME) in before) is pooled
    assert os.path.exists(root / NS / "index.kvi")

    tier = opener(local_url, read_only=True, **bound)
    empty = opener(local_url, namespace=other, read_only=True, **bound)
    assert [as_bytes(b) for b in tier.get(KEYS)] == BLOCKS
    assert list(tier.lookup([*KEYS, b"zz"])) == [True, True, True, False]
    assert list(tier.put([b"new"], [blob(10)], [])) == [False]
    assert list(tier.put([b"n1", b"n2"], [blob(10), blob(20)], [])) == [False, False]
    assert list(tier.evict(KEYS[:1])) == [False]
    assert as_bytes(tier.get(KEYS[:1])[0]) == BLOCKS[0]
    assert empty.get(KEYS) == [None] * 3
    assert sorted(e.key for batch in tier.scan(NS) for e in batch) == sorted(KEYS)
    tier.close()
    empty.close()
    assert tree(root) == before  # no index.kvi rewritten, no pool index, no directory


def test_a_root_that_does_not_exist(tmp_path: Path, opener: Opener) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        opener(f"file://{tmp_path}/missing", read_only=True)
    assert not (tmp_path / "missing").exists()

