"""A reader's buffer of another size than the block: a miss counted in ``size_mismatch``,
and the block stays for every other reader.  A damaged block is still dropped.

The peer side (a second client of the same ``kvtier serve`` node) is in
``tests/peer/test_peer_wrong_size.py``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from kvtier import Namespace, open_chain
from kvtier.block import framing

NS = Namespace("wrong-size-test", dtype="bfloat16", tokens_per_block=32)
KEY, OTHER = b"wrong-size-key", b"other-key"
#: Stored sizes: small, and one whose payload is page-aligned in its block
#: (framing.ALIGN_MIN) and large enough for the one-pass checked copy.
SIZES = [4096, 512 << 10]


def block(size: int) -> bytes:
    return os.urandom(size)


def wrong_sizes(size: int) -> list[int]:
    return [2 * size, size + 1, size - 1, 1]


def fs_tier(tmp_path: Path, codec: str = "none", **over: Any) -> dict[str, Any]:
    return {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/disk", "codec": codec,
            **over}


def host_tier(**over: Any) -> dict[str, Any]:
    return {"name": "ram", "backend": "host", "capacity": "64MiB", **over}


def miss_into(chain: Any, size: int) -> None:
    out = bytearray(size)
    assert chain.get([KEY], [out]) == [False], f"a read into {size} bytes must be a miss"


@pytest.mark.parametrize("mode", ["one-pass", "two-passes"])
@pytest.mark.parametrize("size", SIZES)
def test_a_host_block_read_into_a_buffer_of_another_size_stays(
    size: int, mode: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if mode == "two-passes":
        monkeypatch.setattr(framing, "_xxh3copy", None)
    elif not framing.checks_while_copying():
        pytest.skip("kvtier.block._xxh3copy is not built")
    data, other = block(size), block(100)
    with open_chain({"chain": [host_tier()]}, namespace=NS) as chain:
        assert chain.put([KEY, OTHER], [data, other]) == [True, True]
        with caplog.at_level(logging.WARNING, logger="kvtier.chain.tier"):
            for wrong in wrong_sizes(size):
                miss_into(chain, wrong)
            miss_into(chain, 2 * size)  # the same pair of sizes again: not logged again
        assert chain.get_bytes([KEY, OTHER]) == [data, other]
        out = bytearray(size)
        assert chain.get([KEY], [out]) == [True] and bytes(out) == data
        assert chain.lookup([KEY]) == [0]
        tier = chain.stats()["tiers"][0]
        assert (tier["corrupt"], tier["size_mismatch"]) == (0, 5)
    said = [r.getMessage() for r in caplog.records if "reader's buffer" in r.getMessage()]
    assert len(said) == 4, said
    assert f"holds {size} bytes, the reader's buffer has {2 * size}" in said[0]


@pytest.mark.parametrize("codec", ["none", "zstd"])
@pytest.mark.parametrize("size", SIZES)
def test_an_fs_block_read_into_a_buffer_of_another_size_stays_on_disk(
    tmp_path: Path, size: int, codec: str
) -> None:
    """The issue's case: after a read into 8192 bytes, an fs-only chain opened
    afterwards still had the 4096-byte block."""
    data = block(size)
    config = {"chain": [fs_tier(tmp_path, codec)]}
    with open_chain(config, namespace=NS) as chain:
        assert chain.put([KEY], [data]) == [True]
        for wrong in wrong_sizes(size):
            miss_into(chain, wrong)
        tier = chain.stats()["tiers"][0]
    with open_chain(config, namespace=NS) as chain:
        assert chain.get_bytes([KEY]) == [data]
        out = bytearray(size)
        assert chain.get([KEY], [out]) == [True] and bytes(out) == data
    assert (tier["corrupt"], tier["size_mismatch"]) == (0, 4)


def test_a_read_of_another_size_through_ram_and_disk_keeps_both_copies(tmp_path: Path) -> None:
    data = block(4096)
    config = {"chain": [host_tier(), fs_tier(tmp_path, write="through")]}
    with open_chain(config, namespace=NS) as chain:
        assert chain.put([KEY], [data]) == [True]
        assert chain.flush(30)
        miss_into(chain, 8192)
        assert [t.lookup([KEY]) for t in chain.tiers] == [[True], [True]]
        ram, disk = chain.stats()["tiers"]
        assert (ram["size_mismatch"], disk["size_mismatch"]) == (1, 1)
        assert (ram["corrupt"], disk["corrupt"]) == (0, 0)
        assert chain.get_bytes([KEY]) == [data]


def test_a_damaged_block_read_into_a_buffer_of_another_size_is_corrupt(tmp_path: Path) -> None:
    """The buffer's size excuses nothing: a block that fails its checksum is dropped."""
    data = block(4096)
    with open_chain({"chain": [fs_tier(tmp_path)]}, namespace=NS) as chain:
        assert chain.put([KEY], [data]) == [True]
        (path,) = (tmp_path / "disk").rglob(f"{KEY.hex()}*.kvb")
        damaged = bytearray(path.read_bytes())
        damaged[-10] ^= 0xFF
        path.write_bytes(bytes(damaged))
        miss_into(chain, 8192)
        tier = chain.stats()["tiers"][0]
        assert (tier["corrupt"], tier["size_mismatch"]) == (1, 0)
        assert chain.lookup([KEY]) == [None]
        assert not path.exists()
