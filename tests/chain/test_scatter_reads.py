"""A large direct read of an fs tier lands in runs, each checked as it lands
(kvtier.chain.scatter): a damaged, truncated or foreign block in any run is a
miss, and every other block is served byte for byte."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fs_blocks import block_file, counted_get_into

from kvtier import Namespace, open_chain

NS = Namespace("scatter-test", dtype="float32", tokens_per_block=32)
#: 12 blocks of 1 MiB: three runs of 4 MiB (scatter.RUN_MIN), so three get_into calls
SIZE, N = 1 << 20, 12
KEYS = [b"scatter-%02d" % i for i in range(N)]
#: the damaged block, in the second run
BAD = 5


def payload(i: int) -> bytes:
    return bytes([i]) * 4096 + os.urandom(SIZE - 4096)


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[Any]:
    config = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/disk"}]}
    with open_chain(config, namespace=NS) as opened:
        yield opened


def flip_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-SIZE // 2] ^= 0x01  # a byte of the payload, not of the header
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 4096)


def read_all(chain: Any) -> tuple[list[bool], list[bytearray]]:
    outs = [bytearray(SIZE) for _ in KEYS]
    return chain.get(KEYS, outs), outs


def test_a_large_read_lands_in_runs_and_serves_every_block_byte_for_byte(chain: Any) -> None:
    payloads = [payload(i) for i in range(N)]
    assert chain.put(KEYS, payloads) == [True] * N
    calls = counted_get_into(chain)
    found, outs = read_all(chain)
    assert found == [True] * N
    assert [bytes(o) for o in outs] == payloads
    assert sorted(calls) == [4, 4, 4]  # three runs, each its own call


def test_a_small_read_is_one_call(chain: Any) -> None:
    keys, small = KEYS[:3], [payload(i)[: 256 << 10] for i in range(3)]
    assert chain.put(keys, small) == [True] * 3
    calls = counted_get_into(chain)
    outs = [bytearray(256 << 10) for _ in keys]
    assert chain.get(keys, outs) == [True] * 3
    assert [bytes(o) for o in outs] == small and calls == [3]


def foreign(root: Path) -> Callable[[Path], None]:
    """Copies another key's sound block over the file: the same size, not this key's."""
    def overwrite(path: Path) -> None:
        path.write_bytes(block_file(root, KEYS[0]).read_bytes())
    return overwrite


@pytest.mark.parametrize("damage", ["flipped payload byte", "truncated", "foreign"])
def test_a_damaged_block_in_a_run_is_a_miss_and_the_others_are_served(
    chain: Any, tmp_path: Path, damage: str
) -> None:
    payloads = [payload(i) for i in range(N)]
    assert chain.put(KEYS, payloads) == [True] * N
    path = block_file(tmp_path / "disk", KEYS[BAD])
    {"flipped payload byte": flip_payload_byte, "truncated": truncate,
     "foreign": foreign(tmp_path / "disk")}[damage](path)
    calls = counted_get_into(chain)
    found, outs = read_all(chain)
    assert len(calls) >= 3  # read through the runs
    assert found == [i != BAD for i in range(N)]
    assert [bytes(o) for i, o in enumerate(outs) if i != BAD] == [
        p for i, p in enumerate(payloads) if i != BAD
    ]
    stats = chain.stats()["tiers"][0]
    assert stats["corrupt"] == 1 and stats["hits"] == N - 1
    # dropped: a lookup no longer answers it, and a new read is a plain miss
    assert chain.lookup([KEYS[BAD]]) == [None]

