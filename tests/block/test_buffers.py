"""kvtier.block.buffers: the public helpers a backend uses on a block's buffers, byte for byte."""

from __future__ import annotations

import array
import random

import numpy as np

import kvtier.block.buffers as buffers
from kvtier.block.buffers import (
    byte_views,
    copy_bytes,
    joined,
    nbytes,
    own,
    parts_nbytes,
    scatter,
)


def test_the_helpers_are_public() -> None:
    assert sorted(buffers.__all__) == [
        "byte_views", "copy_bytes", "joined", "landed", "nbytes", "own", "parts_nbytes",
        "scatter",
    ]
    for name in buffers.__all__:
        assert getattr(buffers, name).__doc__, name


def test_byte_counts_of_typed_views() -> None:
    words = array.array("H", range(5))  # 10 bytes, 5 items
    assert nbytes(memoryview(words)) == 10 and len(memoryview(words)) == 5
    assert parts_nbytes([b"abc", memoryview(words), bytearray(7)]) == 20
    assert [len(v) for v in byte_views([memoryview(words), b"", bytearray(3)])] == [10, 3]


def test_own_and_joined_give_bytes_to_keep() -> None:
    data = b"stored"
    assert own(data) is data  # bytes are immutable: no copy
    buf = bytearray(b"reused")
    kept = own(buf)
    buf[:] = b"XXXXXX"
    assert kept == b"reused" and type(kept) is bytes
    assert joined([data]) is data
    assert joined([b"ab", bytearray(b"cd"), memoryview(b"ef")]) == b"abcdef"


def test_scatter_fills_each_buffer_in_order() -> None:
    rng = random.Random(7)
    block = rng.randbytes(1000)
    halves = np.zeros(300, dtype=np.float16)  # 600 bytes, a typed view
    rest = bytearray(400)
    scatter(block, [memoryview(halves), memoryview(rest)])
    assert halves.tobytes() + bytes(rest) == block
    short = bytearray(1000)
    scatter(block, [memoryview(short)], size=10)
    assert bytes(short[:10]) == block[:10] and bytes(short[10:]) == bytes(990)


def test_copy_bytes_small_and_large() -> None:
    rng = random.Random(8)
    for size in (100, (64 << 10) + 17):  # with the GIL held, and through numpy
        src = rng.randbytes(size)
        dst = bytearray(size)
        copy_bytes(memoryview(src), memoryview(dst))
        assert bytes(dst) == src
