"""Group ``put_get``: blocks come back byte for byte, in every shape the contract allows."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvtier.spec import BytesLike

from .base import KitBase, kit_group
from .data import KIB, MIB, block_for, describe, key_of

__all__ = ["PutGetTests"]

ROUND_TRIP_SIZES = {
    "1B": 1,
    "100B": 100,
    "4KiB": 4 * KIB,
    "1MiB": MIB,
    "2MiB": 2 * MIB,
    "8MiB": 8 * MIB,
}

_SHAPES: dict[str, Callable[[bytes], BytesLike]] = {
    "bytes": bytes,
    "bytearray": bytearray,
    "memoryview": lambda b: memoryview(bytearray(b)),
    "memoryview-of-bytes": memoryview,
    "memoryview-slice": lambda b: memoryview(b"<" + b + b">")[1:-1],
}


@kit_group("put_get")
class PutGetTests(KitBase):
    """``kvtier_put``/``kvtier_get`` and their zero-copy variants."""

    def _put_get_fits(self, size: int) -> None:
        limit = self.block_limit()
        if limit is not None and size > limit:
            pytest.skip(f"{size} bytes exceed the backend's declared limit of {limit} bytes")

    def _put_get_check(self, keys: list[bytes], expected: list[bytes | None]) -> None:
        got = self.store.get(keys)
        for key, want, have in zip(keys, expected, got):
            assert have == want, f"get({key!r}) returned {describe(want, have)}"

    @pytest.mark.parametrize("size", list(ROUND_TRIP_SIZES.values()), ids=list(ROUND_TRIP_SIZES))
    def test_round_trip(self, size: int) -> None:
        self._put_get_fits(size)
        key = key_of("size", size)
        block = block_for(key, size)
        flags = self.store.put([key], [block])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        self._put_get_check([key], [block])
        flags = self.store.lookup([key])
        assert flags == [True], (
            f"lookup answered {flags} where [True] was expected: "
            "lookup answers True exactly for the keys stored"
        )

    def test_batch_with_hits_and_misses(self) -> None:
        keys = [key_of("mixed", i) for i in range(8)]
        stored = keys[::2]
        blocks = [block_for(k, 1000 + i) for i, k in enumerate(stored)]
        flags = self.store.put(stored, blocks)
        assert flags == [True] * len(stored), (
            f"put answered {flags} where [True] * len(stored) was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        expected: list[bytes | None] = [None] * len(keys)
        for i, block in enumerate(blocks):
            expected[2 * i] = block
        order = [7, 0, 3, 2, 5, 4, 1, 6]  # out of put order: answers must follow the request
        self._put_get_check([keys[i] for i in order], [expected[i] for i in order])
        flags = self.store.lookup(keys)
        assert flags == [b is not None for b in expected], (
            f"lookup answered {flags} where [b is not None for b in expected] was expected: "
            "lookup answers True exactly for the keys stored"
        )

    def test_repeated_key_in_one_put(self) -> None:
        key, other = key_of("dup-put", 0), key_of("dup-put", 1)
        block, other_block = block_for(key, 300), block_for(other, 200)
        flags = self.store.put([key, other, key], [block, other_block, block])
        assert flags == [True] * 3, (
            f"put answered {flags} where [True] * 3 was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        self._put_get_check([key, other], [block, other_block])

    def test_repeated_key_in_one_get(self) -> None:
        key, missing = key_of("dup-get", 0), key_of("dup-get", 1)
        block = block_for(key, 500)
        flags = self.store.put([key], [block])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        self._put_get_check([key, missing, key, missing, key], [block, None, block, None, block])
        flags = self.store.lookup([key, key, missing, missing])
        assert flags == [True, True, False, False], (
            f"lookup answered {flags} where [True, True, False, False] was expected: "
            "lookup answers True exactly for the keys stored"
        )

    def test_put_of_a_stored_key_answers_true(self) -> None:
        key = key_of("again", 0)
        block = block_for(key, 700)
        flags = self.store.put([key], [block])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        assert self.store.put([key], [block]) == [True], "a stored key must answer True again"
        self._put_get_check([key], [block])

    def test_empty_batches(self) -> None:
        store = self.store
        flags = store.put([], [])
        assert flags == [], (
            f"put answered {flags} where [] was expected: "
            "an empty batch answers an empty list"
        )
        got = store.get([])
        assert got == [], (
            f"get answered {got} where [] was expected: "
            "an empty batch answers an empty list"
        )
        flags = store.lookup([])
        assert flags == [], (
            f"lookup answered {flags} where [] was expected: "
            "an empty batch answers an empty list"
        )
        flags = store.evict([])
        assert flags == [], (
            f"evict answered {flags} where [] was expected: "
            "an empty batch answers an empty list"
        )
        if store.implements("kvtier_put_parts"):
            flags = store.put_parts([], [])
            assert flags == [], (
                f"put_parts answered {flags} where [] was expected: "
                "an empty batch answers an empty list"
            )
        if store.implements("kvtier_get_into"):
            sizes = store.get_into([], [])
            assert sizes == [], (
                f"get_into answered {sizes} where [] was expected: "
                "an empty batch answers an empty list"
            )

    @pytest.mark.parametrize(
        "key",
        [b"\x00", b"/", b".", b"\xff", b"k" * 64, bytes(range(64)), b"../" * 21 + b"x"],
        ids=["nul", "slash", "dot", "ff", "64-letters", "64-binary", "64-dotdot"],
    )
    def test_key_lengths_and_bytes(self, key: bytes) -> None:
        block = block_for(key, 333)
        other = key[:-1] + bytes([key[-1] ^ 1])  # differs in the last byte only
        flags = self.store.put([key], [block])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        self._put_get_check([key, other], [block, None])
        flags = self.store.lookup([key, other])
        assert flags == [True, False], (
            f"lookup answered {flags} where [True, False] was expected: "
            "lookup answers True exactly for the keys stored"
        )

    @pytest.mark.parametrize("shape", list(_SHAPES))
    def test_put_accepts_bytes_like(self, shape: str) -> None:
        key = key_of(f"shape-{shape}", 0)
        block = block_for(key, 4 * KIB + 1)
        flags = self.store.put([key], [_SHAPES[shape](block)])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        self._put_get_check([key], [block])

    def test_put_copies_the_callers_buffer(self) -> None:
        keys = [key_of("copy", i) for i in range(2)]
        blocks = [block_for(k, 4 * KIB) for k in keys]
        owned = bytearray(blocks[0])
        backing = bytearray(blocks[1])
        flags = self.store.put(keys, [owned, memoryview(backing)])
        assert flags == [True, True], (
            f"put answered {flags} where [True, True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        # the caller reuses its buffers as soon as put returns
        owned[:] = b"\xaa" * len(owned)
        backing[:] = b"\x55" * len(backing)
        self._put_get_check(keys, list(blocks))

    def test_returned_blocks_never_change(self) -> None:
        keys = [key_of("keep", i) for i in range(3)]
        blocks = [block_for(k, 2 * KIB) for k in keys]
        flags = self.store.put(keys, blocks)
        assert flags == [True] * 3, (
            f"put answered {flags} where [True] * 3 was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        kept = self.store.get_raw(keys)
        # the caller may keep what get returned; later calls must not touch it
        self.store.evict(keys[:1])
        later = [key_of("keep", 10 + i) for i in range(3)]
        self.store.put(later, [block_for(k, 2 * KIB) for k in later])
        self.store.get(keys + later)
        self._put_get_kept(keys, blocks, kept, "evicts, puts and gets")

    def _put_get_kept(
        self, keys: list[bytes], blocks: list[bytes], kept: list[BytesLike | None], what: str
    ) -> None:
        for key, want, have in zip(keys, blocks, kept):
            assert have is not None, f"get({key!r}) missed a block just put"
            got = bytes(have)
            assert got == want, (
                f"the block get returned for {key!r} changed after later {what}: it now holds "
                f"{describe(want, got)}; a backend must not reuse a buffer it handed out"
            )

    def test_returned_blocks_survive_reuse_of_read_buffers(self) -> None:
        # same sizes everywhere: a backend that recycles read buffers or freed
        # slots reuses exactly these for the next blocks
        size = 3 * KIB + 1
        first = [key_of("reuse-a", i) for i in range(4)]
        second = [key_of("reuse-b", i) for i in range(4)]
        blocks = {k: block_for(k, size) for k in first + second}
        flags = self.store.put(first + second, [blocks[k] for k in first + second])
        assert flags == [True] * 8, (
            f"put answered {flags} where [True] * 8 was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        kept = self.store.get_raw(first)
        kept_repeat = self.store.get_raw([first[0], first[0]])
        # other blocks read into the same positions, in another order, and again
        self.store.get_raw(second)
        self.store.get_raw(second[::-1] + first[::-1])
        self.store.get_raw([second[0]] * 4)
        if self.store.implements("kvtier_get_into"):
            outs = [bytearray(size) for _ in second]
            self.store.get_into(second, [[memoryview(o)] for o in outs])
        # freed space reused by new blocks of the same size
        flags = self.store.evict(first[2:])
        assert flags == [True, True], (
            f"evict answered {flags} where [True, True] was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        fresh = [key_of("reuse-c", i) for i in range(4)]
        self.store.put(fresh, [block_for(k, size) for k in fresh])
        self.store.get_raw(fresh)
        self._put_get_kept(first, [blocks[k] for k in first], kept, "gets, evicts and puts")
        self._put_get_kept(
            [first[0]] * 2, [blocks[first[0]]] * 2, kept_repeat, "gets, evicts and puts"
        )

    def test_repeated_key_with_different_bytes_in_one_put(self) -> None:
        # Blocks are immutable once stored.  Several values for one key in
        # one batch: get answers exactly one of them, never a mix, and it
        # stays the one stored (which one: test_repeated_key_in_one_put_stores_the_first).
        key, other = key_of("dup-diff", 0), key_of("dup-diff", 1)
        # the last value longer than the first: a length from one and bytes from another show
        values = [block_for(key, 300), block_for(key + b"/2", 300), block_for(key + b"/3", 5000)]
        other_block = block_for(other, 700)
        flags = self.store.put([key, other, key, key], [values[0], other_block, *values[1:]])
        assert flags == [True] * 4, f"put of a repeated key answered {flags}"
        (have,) = self.store.get([key])
        assert have in values, (
            f"a key put three times in one batch with different bytes read back {len(have or b'')} "
            "bytes that are none of the values put (a mix, or a miss)"
        )
        self._put_get_check([other], [other_block])
        flags = self.store.put([key], [block_for(key + b"/4", 300)])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        self._put_get_check([key], [have])

    def test_repeated_key_in_one_put_stores_the_first(self) -> None:
        # The contract names the occurrence: the first is stored, every later
        # one answers True without storing.  Same lengths, so only the bytes tell.
        key, other = key_of("dup-first", 0), key_of("dup-first", 1)
        size = max(1, min(4 * KIB, (self.block_limit() or 4 * KIB) // 4))
        values = [block_for(key + b"/%d" % i, size) for i in range(3)]
        other_block = block_for(other, 100)
        flags = self.store.put([key, key, other, key], [values[0], values[1], other_block,
                                                          values[2]])
        assert flags == [True] * 4, f"put of a repeated key answered {flags}"
        (have,) = self.store.get([key])
        which = next((f"occurrence {i + 1}" for i, v in enumerate(values) if v == have), None)
        assert have == values[0], (
            f"a key put three times in one batch read back "
            f"{which or describe(values[0], have)}: the first occurrence is the one stored"
        )
        self._put_get_check([other], [other_block])

    def test_put_of_a_stored_key_keeps_the_stored_block(self) -> None:
        key = key_of("immutable", 0)
        block, other = block_for(key, 900), block_for(key + b"/other", 900)
        flags = self.store.put([key], [block])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        assert self.store.put([key], [other]) == [True], "a put of a stored key must answer True"
        (have,) = self.store.get([key])
        assert have == block, (
            f"after a second put of a stored key with other bytes, get returned "
            f"{'the second value' if have == other else describe(block, have)}; a block is "
            "immutable once stored"
        )

    def test_put_parts_equals_put(self) -> None:
        if not self.store.implements("kvtier_put_parts"):
            pytest.skip(f"backend {self.backend!r} does not implement kvtier_put_parts")
        keys = [key_of("parts", i) for i in range(4)]
        blocks = [block_for(k, size) for k, size in zip(keys, (1, 100, 70_001, 4 * KIB))]
        parts: list[list[BytesLike]] = [
            [blocks[0]],
            [blocks[1][:10], b"", bytearray(blocks[1][10:])],
            [
                memoryview(blocks[2])[:5],
                blocks[2][5:40_000],
                memoryview(bytearray(blocks[2][40_000:])),
            ],
            [blocks[3][:1], blocks[3][1:2], blocks[3][2:]],
        ]
        flags = self.store.put_parts(keys, parts)
        assert flags == [True] * 4, (
            f"put_parts answered {flags} where [True] * 4 was expected: "
            "a put_parts of blocks within the declared limits stores each and answers True"
        )
        self._put_get_check(keys, list(blocks))
        # a key already stored through put answers True through put_parts too
        flags = self.store.put_parts(keys[:1], [[blocks[0]]])
        assert flags == [True], (
            f"put_parts answered {flags} where [True] was expected: "
            "a put_parts of blocks within the declared limits stores each and answers True"
        )

    def test_put_parts_copies_the_callers_buffers(self) -> None:
        if not self.store.implements("kvtier_put_parts"):
            pytest.skip(f"backend {self.backend!r} does not implement kvtier_put_parts")
        key = key_of("parts-copy", 0)
        block = block_for(key, 8 * KIB)
        head, tail = bytearray(block[:100]), bytearray(block[100:])
        flags = self.store.put_parts([key], [[head, memoryview(tail)]])
        assert flags == [True], (
            f"put_parts answered {flags} where [True] was expected: "
            "a put_parts of blocks within the declared limits stores each and answers True"
        )
        head[:] = bytes(len(head))
        tail[:] = bytes(len(tail))
        self._put_get_check([key], [block])

    def test_get_into(self) -> None:
        if not self.store.implements("kvtier_get_into"):
            pytest.skip(f"backend {self.backend!r} does not implement kvtier_get_into")
        keys = [key_of("into", i) for i in range(3)]
        blocks = [block_for(k, size) for k, size in zip(keys, (1, 5000, 70_001))]
        flags = self.store.put(keys, blocks)
        assert flags == [True] * 3, (
            f"put answered {flags} where [True] * 3 was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        missing = key_of("into", 99)
        # exact sizes, split across several buffers; one wrong size; one miss
        outs = [bytearray(1), bytearray(5000), bytearray(70_001)]
        scatter = [
            [memoryview(outs[0])],
            [memoryview(outs[1])[:1], memoryview(outs[1])[1:4096], memoryview(outs[1])[4096:]],
            [memoryview(outs[2])[:3], memoryview(outs[2])[3:]],
        ]
        short = bytearray(4999)
        sizes = self.store.get_into(
            [*keys, keys[1], missing],
            [*scatter, [memoryview(short)], [memoryview(bytearray(10))]],
        )
        assert sizes == [1, 5000, 70_001, 5000, None], (
            "get_into must answer the stored size for a hit (whatever the buffers' size) "
            "and None for a miss"
        )
        for key, want, have in zip(keys, blocks, outs):
            assert bytes(have) == want, f"get_into({key!r}) filled {describe(want, bytes(have))}"

    def test_get_into_repeated_key(self) -> None:
        if not self.store.implements("kvtier_get_into"):
            pytest.skip(f"backend {self.backend!r} does not implement kvtier_get_into")
        key = key_of("into-dup", 0)
        block = block_for(key, 3000)
        flags = self.store.put([key], [block])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        outs = [bytearray(3000), bytearray(3000)]
        sizes = self.store.get_into([key, key], [[memoryview(o)] for o in outs])
        assert sizes == [3000, 3000], (
            f"get_into answered {sizes} where [3000, 3000] was expected: "
            "get_into answers the stored size for each hit and None for a miss"
        )
        assert [bytes(o) for o in outs] == [block, block], (
            "get_into of a key repeated in one batch must fill every occurrence's buffers"
        )

    def test_refuses_blocks_over_max_block_size(self) -> None:
        limit = self.caps.max_block_size
        if limit is None:
            pytest.skip(f"backend {self.backend!r} declares no max_block_size")
        if limit > 256 * MIB:
            pytest.skip(f"max_block_size {limit} is too large for the kit to allocate")
        small, large = key_of("max", 0), key_of("max", 1)
        flags = self.store.put([small, large], [block_for(small, 10), bytes(limit + 1)])
        assert flags == [True, False], "a block over max_block_size must be refused (False)"
        self._put_get_check([small, large], [block_for(small, 10), None])
