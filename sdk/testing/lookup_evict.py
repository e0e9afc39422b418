"""Groups ``lookup`` and ``evict``: the index agrees with the data, removal is exact."""

from __future__ import annotations

from .base import KitBase, kit_group
from .data import block_for, describe, key_of, shown, size_for

__all__ = ["EvictTests", "LookupTests"]


@kit_group("lookup")
class LookupTests(KitBase):
    """``kvtier_lookup`` answers True exactly where ``kvtier_get`` hits."""

    def _lookup_agree(self, keys: list[bytes], model: dict[bytes, bytes], note: str) -> None:
        got = self.store.get(keys)
        found = self.store.lookup(keys)
        silent = self.caps.capacity is not None and not self.caps.reports_evictions
        for key, data, hit in zip(keys, got, found):
            if silent and data is None:
                model.pop(key, None)  # an unreported capacity eviction is allowed here
            want = model.get(key)
            assert data == want, f"{note}: get({key!r}) returned {describe(want, data)}"
            if self.lookup_exact or not hit:
                assert hit is (data is not None), (
                    f"{note}: lookup({key!r}) answered {hit} but get answered "
                    f"{'a hit' if data is not None else 'a miss'}"
                )

    def test_lookup_of_unknown_keys(self) -> None:
        keys = [key_of("unknown", i) for i in range(5)]
        flags = self.store.lookup(keys)
        assert flags == [False] * 5, (
            f"lookup answered {flags} where [False] * 5 was expected: "
            "lookup answers True exactly for the keys stored"
        )
        got = self.store.get(keys)
        assert got == [None] * 5, (
            f"get returned {shown(got)} where [None] * 5 was expected: "
            "a block reads back exactly as stored, and a key not stored is a miss"
        )

    def test_lookup_agrees_with_get_after_random_operations(self) -> None:
        universe = [key_of("agree", i) for i in range(40)]
        limit = self.block_limit()
        model: dict[bytes, bytes] = {}
        rng = self.rng
        for step in range(120):
            batch = rng.sample(universe, rng.randint(0, 5))
            op = rng.random()
            if op < 0.5:
                blocks = [block_for(k, size_for(k, limit)) for k in batch]
                evicted: list[tuple[bytes, bytes]] = []
                flags = self.store.put(batch, blocks, evicted)
                assert all(flags), f"step {step}: put refused a block within the declared limits"
                for key, block in zip(batch, blocks):
                    model[key] = block
                for key, _ in evicted:  # the capacity group checks these in detail
                    model.pop(key, None)
            elif op < 0.75:
                self.store.evict(batch)
                for key in batch:
                    model.pop(key, None)
            else:
                self._lookup_agree(batch, model, f"step {step}")
        self._lookup_agree(universe, model, "after 120 random operations")

    def test_lookup_repeated_and_mixed(self) -> None:
        stored, missing = key_of("lk", 0), key_of("lk", 1)
        flags = self.store.put([stored], [block_for(stored, 64)])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        flags = self.store.lookup([missing, stored, stored, missing])
        assert flags == [False, True, True, False], (
            f"lookup answered {flags} where [False, True, True, False] was expected: "
            "lookup answers True exactly for the keys stored"
        )


@kit_group("evict")
class EvictTests(KitBase):
    """``kvtier_evict`` removes exactly what it is asked to, once."""

    def _evict_put(self, keys: list[bytes]) -> list[bytes]:
        blocks = [block_for(k, 1000) for k in keys]
        flags = self.store.put(keys, blocks)
        assert flags == [True] * len(keys), (
            f"put answered {flags} where [True] * len(keys) was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        return blocks

    def test_evicted_keys_are_gone(self) -> None:
        keys = [key_of("evict", i) for i in range(6)]
        blocks = self._evict_put(keys)
        flags = self.store.evict(keys[:3])
        assert flags == [True] * 3, (
            f"evict answered {flags} where [True] * 3 was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        flags = self.store.lookup(keys)
        assert flags == [False] * 3 + [True] * 3, (
            f"lookup answered {flags} where [False] * 3 + [True] * 3 was expected: "
            "lookup answers True exactly for the keys stored"
        )
        got = self.store.get(keys)
        expected: list[bytes | None] = [None, None, None, *blocks[3:]]
        for key, want, have in zip(keys, expected, got):
            assert have == want, f"after evict, get({key!r}) returned {describe(want, have)}"

    def test_evict_answers_true_exactly_once(self) -> None:
        key = key_of("once", 0)
        self._evict_put([key])
        flags = self.store.evict([key])
        assert flags == [True], (
            f"evict answered {flags} where [True] was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        assert self.store.evict([key]) == [False], "a second evict must answer False"

    def test_repeated_key_in_one_evict(self) -> None:
        key = key_of("once", 1)
        self._evict_put([key])
        assert self.store.evict([key, key]) == [True, False], (
            "a key repeated in one evict batch is removed by its first mention"
        )

    def test_evicting_unknown_keys_is_harmless(self) -> None:
        kept = [key_of("kept", i) for i in range(3)]
        blocks = self._evict_put(kept)
        unknown = [key_of("never", i) for i in range(3)]
        flags = self.store.evict(unknown)
        assert flags == [False] * 3, (
            f"evict answered {flags} where [False] * 3 was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        flags = self.store.evict([unknown[0], kept[1], unknown[1]])
        assert flags == [False, True, False], (
            f"evict answered {flags} where [False, True, False] was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        expected = [blocks[0], None, blocks[2]]
        for key, want, have in zip(kept, expected, self.store.get(kept)):
            assert have == want, f"get({key!r}) returned {describe(want, have)}"

    def test_put_after_evict_stores_again(self) -> None:
        key = key_of("again", 1)
        block = self._evict_put([key])[0]
        flags = self.store.evict([key])
        assert flags == [True], (
            f"evict answered {flags} where [True] was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        flags = self.store.put([key], [block])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        got = self.store.get([key])
        assert got == [block], (
            f"get returned {shown(got)} where [block] was expected: "
            "a block reads back exactly as stored, and a key not stored is a miss"
        )
        flags = self.store.lookup([key])
        assert flags == [True], (
            f"lookup answered {flags} where [True] was expected: "
            "lookup answers True exactly for the keys stored"
        )

    def test_evict_leaves_others_exact(self) -> None:
        keys = [key_of("many", i) for i in range(20)]
        sizes = [size_for(k, self.block_limit()) for k in keys]
        blocks = [block_for(k, s) for k, s in zip(keys, sizes)]
        flags = self.store.put(keys, blocks)
        assert flags == [True] * 20, (
            f"put answered {flags} where [True] * 20 was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        gone = set(self.rng.sample(range(20), 8))
        flags = self.store.evict([keys[i] for i in sorted(gone)])
        assert flags == [True] * 8, (
            f"evict answered {flags} where [True] * 8 was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        got = self.store.get(keys)
        for i, (key, have) in enumerate(zip(keys, got)):
            want = None if i in gone else blocks[i]
            assert have == want, f"get({key!r}) returned {describe(want, have)}"
