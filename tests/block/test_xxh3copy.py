"""The one-pass copy and checksum in C (``kvtier.block._xxh3copy``), held to the xxhash package.

Every result is compared with ``xxhash.xxh3_64_intdigest``, the reference the
block format is written with, and every copy byte for byte with its source:
at the sizes where XXH3's stripes (64 bytes) and blocks (1024 bytes) begin and
end, at random sizes and seeds, from and to unaligned addresses, with both
kernels (AVX2 where the CPU has it, and the portable one).
"""

from __future__ import annotations

import os
import threading

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    from kvtier.block import _xxh3copy
except ImportError:
    # `make test` builds it and says so: there, a missing extension is a failure
    if os.environ.get("KVTIER_REQUIRE_XXH3COPY"):
        raise
    pytest.skip("kvtier.block._xxh3copy is not built (no C compiler at install)",
                allow_module_level=True)

MIN = _xxh3copy.MIN_LEN
EDGES = sorted({MIN, 255, 256, 257, 319, 320, 321, 1023, 1024, 1025, 1087, 1088, 1089,
                2047, 2048, 2049, 4096 + 63, 4096 + 64, 4096 + 65, 65_536, (1 << 20) + 1,
                2 << 20})
SEEDS = [0, 2, 4, 8, 1 << 63, (1 << 64) - 1]
COPIES = {"best": _xxh3copy.copy_xxh3_64, "portable": _xxh3copy.copy_xxh3_64_portable}


def test_the_kernel_is_named_and_inputs_start_past_the_short_forms() -> None:
    assert _xxh3copy.KERNEL in ("avx2", "portable")
    assert MIN == 241  # XXH3's long-input form starts past 240 bytes


@pytest.mark.parametrize("copy", list(COPIES.values()), ids=list(COPIES))
@pytest.mark.parametrize("size", EDGES)
def test_copy_and_hash_match_xxhash_at_the_edges(copy: object, size: int) -> None:
    src = os.urandom(size)
    for seed in SEEDS:
        dst = bytearray(size)
        assert copy(src, dst, seed) == xxhash.xxh3_64_intdigest(src, seed=seed)  # type: ignore[operator]
        assert dst == src
        assert _xxh3copy.xxh3_64(src, seed) == xxhash.xxh3_64_intdigest(src, seed=seed)


@given(data=st.binary(min_size=MIN, max_size=6000), seed=st.integers(0, (1 << 64) - 1),
       src_at=st.integers(0, 63), dst_at=st.integers(0, 63))
@settings(max_examples=300, deadline=None)
def test_any_bytes_any_seed_any_alignment(data: bytes, seed: int, src_at: int, dst_at: int
                                          ) -> None:
    want = xxhash.xxh3_64_intdigest(data, seed=seed)
    src = memoryview(bytes(src_at) + data)[src_at:]
    for copy in COPIES.values():
        backing = bytearray(b"\xaa" * (dst_at + len(data) + 8))
        dst = memoryview(backing)[dst_at : dst_at + len(data)]
        assert copy(src, dst, seed) == want
        assert bytes(dst) == data
        # nothing written outside the destination
        assert backing[:dst_at] == b"\xaa" * dst_at and backing[-8:] == b"\xaa" * 8


def test_a_changed_byte_changes_the_hash_wherever_it_is() -> None:
    data = bytearray(os.urandom(5000))
    base = _xxh3copy.xxh3_64(data)
    for at in (0, 63, 64, 1023, 1024, 4935, 4936, 4999):  # stripes, blocks, the last stripe
        data[at] ^= 1
        assert _xxh3copy.copy_xxh3_64(data, bytearray(5000)) != base, at
        data[at] ^= 1


def test_bad_arguments_are_refused_and_nothing_is_written() -> None:
    src = os.urandom(300)
    dst = bytearray(b"\1" * 299)
    with pytest.raises(ValueError, match="300 bytes, destination 299"):
        _xxh3copy.copy_xxh3_64(src, dst)
    assert dst == b"\1" * 299
    with pytest.raises(ValueError, match="241 bytes or more"):
        _xxh3copy.copy_xxh3_64(src[:240], bytearray(240))
    with pytest.raises(TypeError):
        _xxh3copy.copy_xxh3_64(src, bytes(300))  # type: ignore[arg-type]  # read-only
    with pytest.raises(BufferError):
        _xxh3copy.copy_xxh3_64(memoryview(bytearray(600))[::2], bytearray(300))
    for seed in (-1, 1 << 64):
        with pytest.raises(OverflowError):
            _xxh3copy.copy_xxh3_64(src, bytearray(300), seed)
    with pytest.raises(TypeError):
        _xxh3copy.xxh3_64(src, 1.5)  # type: ignore[arg-type]


def test_threads_copying_at_once_each_get_their_own_bytes_and_hash() -> None:
    # the kernels run without the GIL: any state shared between calls would show here
    blocks = [os.urandom((1 << 20) + 17 * i) for i in range(8)]
    wrong: list[int] = []

    def work(i: int) -> None:
        for _ in range(20):
            dst = bytearray(len(blocks[i]))
            got = _xxh3copy.copy_xxh3_64(blocks[i], dst, i)
            if got != xxhash.xxh3_64_intdigest(blocks[i], seed=i) or dst != blocks[i]:
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(blocks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
