"""Group ``persistence``: blocks outlive the instance that stored them."""

from __future__ import annotations

from .base import KitBase, kit_group
from .data import KIB, MIB, block_for, describe, key_of, shown

__all__ = ["PersistenceTests"]

#: Figures of ``kvtier_stats`` that must read the same after a reopen.
KEPT_STATS = ("used_bytes", "blocks")


@kit_group("persistence")
class PersistenceTests(KitBase):
    """Runs when the backend declares ``persistent=True``."""

    def _persistence_sizes(self) -> list[int]:
        sizes = [1, 100, 4 * KIB, 65_539, MIB, 3 * MIB + 1]
        limit = self.block_limit()
        if limit is not None:
            sizes = [s for s in sizes if s <= limit]
        if self.caps.capacity is not None:
            while sizes and sum(sizes) > self.caps.capacity // 2:
                sizes.pop()  # stay clear of capacity evictions: they are another group's
        return sizes

    def _persistence_verify(self, model: dict[bytes, bytes | None], note: str) -> None:
        keys = sorted(model)
        got = self.store.get(keys)
        for key, have in zip(keys, got):
            want = model[key]
            assert have == want, f"{note}: get({key!r}) returned {describe(want, have)}"
        found = self.store.lookup(keys)
        for key, hit in zip(keys, found):
            if self.lookup_exact or not hit:
                assert hit is (model[key] is not None), f"{note}: lookup({key!r}) answered {hit}"

    def _persistence_put(
        self, model: dict[bytes, bytes | None], keys: list[bytes], sizes: list[int]
    ) -> None:
        blocks = [block_for(k, s) for k, s in zip(keys, sizes)]
        evicted: list[tuple[bytes, bytes]] = []
        flags = self.store.put(keys, blocks, evicted)
        assert flags == [True] * len(keys), (
            f"put answered {flags} where [True] * len(keys) was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        model.update(zip(keys, blocks))
        for key, _ in evicted:
            model[key] = None

    def _persistence_reopen(self, note: str) -> None:
        before = self.store.stats()
        self.reopen()
        after = self.store.stats()
        for name in KEPT_STATS:
            if name in before and name in after:
                assert after[name] == before[name], (
                    f"{note}: stats()[{name!r}] was {before[name]} before close, "
                    f"{after[name]} after reopen"
                )

    def test_blocks_survive_reopen(self) -> None:
        model: dict[bytes, bytes | None] = {}
        sizes = self._persistence_sizes()
        self._persistence_put(model, [key_of("persist", i) for i in range(len(sizes))], sizes)
        small = [key_of("small", i) for i in range(12)]
        self._persistence_put(model, small, [10 + i for i in range(12)])
        gone = small[::3]
        flags = self.store.evict(gone)
        assert flags == [True] * len(gone), (
            f"evict answered {flags} where [True] * len(gone) was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        model.update(dict.fromkeys(gone))
        self._persistence_reopen("first reopen")
        self._persistence_verify(model, "after the first reopen")
        # a second cycle: changes made after a reopen persist as well
        more = [key_of("more", i) for i in range(5)]
        self._persistence_put(model, more, [4 * KIB] * 5)
        again = [small[1], more[0]]
        flags = self.store.evict(again)
        assert flags == [True, True], (
            f"evict answered {flags} where [True, True] was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        model.update(dict.fromkeys(again))
        self._persistence_reopen("second reopen")
        self._persistence_verify(model, "after the second reopen")

    def test_empty_store_reopens_empty(self) -> None:
        self._persistence_reopen("reopen of an empty store")
        keys = [key_of("nothing", i) for i in range(3)]
        flags = self.store.lookup(keys)
        assert flags == [False] * 3, (
            f"lookup answered {flags} where [False] * 3 was expected: "
            "lookup answers True exactly for the keys stored"
        )
        got = self.store.get(keys)
        assert got == [None] * 3, (
            f"get returned {shown(got)} where [None] * 3 was expected: "
            "a block reads back exactly as stored, and a key not stored is a miss"
        )
        blocks = self.store.stats().get("blocks")
        assert blocks in (None, 0), f"an empty store reopened with stats()['blocks'] = {blocks}"

    def test_reopen_without_access_in_between(self) -> None:
        model: dict[bytes, bytes | None] = {}
        keys = [key_of("idle", i) for i in range(4)]
        self._persistence_put(model, keys, [5000] * 4)
        self.reopen()
        self._persistence_reopen("reopen of an untouched store")
        self._persistence_verify(model, "after two reopens")
