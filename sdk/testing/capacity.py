"""Group ``capacity``: a declared capacity holds, and what it pushes out is reported exactly."""

from __future__ import annotations

import pytest

from .base import KitBase, kit_group
from .data import MIB, block_for, describe, key_of

__all__ = ["CapacityTests"]

#: Largest capacity the kit fills (three times over) in a test.
MAX_FILLED_CAPACITY = 64 * MIB


@kit_group("capacity")
class CapacityTests(KitBase):
    """Runs when ``Capabilities.capacity`` is declared."""

    def _capacity_or_skip(self, most: int) -> int:
        cap = self.caps.capacity
        assert cap is not None  # the group is skipped otherwise
        if cap > most:
            pytest.skip(
                f"capacity {cap} bytes is too large for the kit to fill; "
                f"configure at most {most} bytes for the kit"
            )
        return cap

    def _capacity_present(self, keys: list[bytes], note: str) -> list[bool]:
        """Which ``keys`` are stored, asked with lookup (cheaper), or get for a stale lookup.

        A lookup is no access: it must change neither what is stored nor what
        it counts against the capacity, so the kit can observe with it.
        """
        if not self.lookup_exact:
            return [block is not None for block in self.store.get(keys)]
        before = self._capacity_held()
        found = self.store.lookup(keys)
        after = self._capacity_held()
        for name in before.keys() & after.keys():
            assert before[name] == after[name], (
                f"{note}: kvtier_lookup of {len(keys)} keys changed stats()[{name!r}] from "
                f"{before[name]} to {after[name]}; this capacity failure is caused by lookup: "
                "a lookup is not an access that costs capacity or evicts"
            )
        return found

    def _capacity_held(self) -> dict[str, int | float]:
        stats = self.store.stats()
        return {k: stats[k] for k in ("used_bytes", "blocks") if k in stats}

    def _capacity_lookup_culprit(self, keys: list[bytes]) -> str:
        """Words naming kvtier_lookup if a lookup alone removes blocks get finds, else ""."""
        if not self.lookup_exact or not keys:
            return ""
        before = [k for k, b in zip(keys, self.store.get(keys)) if b is not None]
        self.store.lookup(keys)
        after = {k for k, b in zip(before, self.store.get(before)) if b is not None}
        gone = [k for k in before if k not in after]
        if not gone:
            return ""
        return (
            f"; this capacity failure is caused by lookup: a kvtier_lookup alone removed "
            f"{len(gone)} blocks ({gone[:2]}), unreported: a lookup must not evict"
        )

    def _capacity_used_within(self, cap: int, note: str) -> None:
        used = self.store.stats().get("used_bytes")
        if used is not None:
            assert used <= cap, f"{note}: stats() reports used_bytes={used} > capacity {cap}"

    def test_capacity_holds_and_evictions_are_reported(self) -> None:
        cap = self._capacity_or_skip(MAX_FILLED_CAPACITY)
        caps, rng, store = self.caps, self.rng, self.store
        silent = not caps.reports_evictions
        limits = [cap // 4, MIB] + ([caps.max_block_size] if caps.max_block_size else [])
        largest = max(1, min(limits))
        model: dict[bytes, bytes] = {}  # what the kit knows is stored
        put_bytes = vanished_total = step = 0
        while put_bytes < 3 * cap and step < 5000:
            step += 1
            op = rng.random()
            if op < 0.1 and model:
                victims = rng.sample(sorted(model), min(len(model), rng.randint(1, 2)))
                for key, flag in zip(victims, store.evict(victims)):
                    assert flag or silent, f"step {step}: evict({key!r}) of a stored key: False"
                    del model[key]
                self._capacity_used_within(cap, f"step {step}")
                continue
            if op < 0.2 and model:
                sample = rng.sample(sorted(model), min(3, len(model)))
                for key, data in zip(sample, store.get(sample)):
                    if data is None and silent:
                        del model[key]
                        continue
                    assert data == model[key], (
                        f"step {step}: get({key!r}) returned {describe(model[key], data)}"
                    )
                continue
            keys = [key_of("cap", step * 8 + j) for j in range(rng.randint(1, 4))]
            sizes = [largest if rng.random() < 0.2 else rng.randint(1, largest) for _ in keys]
            blocks = [block_for(k, s) for k, s in zip(keys, sizes)]
            evicted: list[tuple[bytes, bytes]] = []
            flags = store.put(keys, blocks, evicted)
            assert all(flags), f"step {step}: put refused blocks within the capacity: {flags}"
            put_bytes += sum(sizes)
            candidates = {**model, **dict(zip(keys, blocks))}
            order = sorted(candidates)
            present = self._capacity_present(order, f"step {step}")
            now = {k for k, here in zip(order, present) if here}
            held = sum(len(candidates[k]) for k in now)
            assert held <= cap, (
                f"step {step}: {held} bytes of blocks are stored, more than the capacity {cap}"
            )
            self._capacity_used_within(cap, f"step {step}")
            reported: dict[bytes, bytes] = {}
            for key, data in evicted:
                assert key not in reported, f"step {step}: {key!r} reported as evicted twice"
                assert key in candidates, f"step {step}: {key!r} reported but never stored"
                assert data == candidates[key], (
                    f"step {step}: eviction of {key!r} reported {describe(candidates[key], data)}"
                )
                reported[key] = data
            vanished = set(candidates) - now
            if not silent:
                unreported = sorted(vanished - set(reported))
                culprit = self._capacity_lookup_culprit(sorted(now)) if unreported else ""
                assert not unreported, (
                    f"step {step}: {unreported[:3]} vanished without being reported in "
                    f"evicted{culprit}"
                )
                still_there = sorted(set(reported) & now)
                assert not still_there, (
                    f"step {step}: {still_there[:3]} reported as evicted but still stored"
                )
            vanished_total += len(vanished)
            model = {k: candidates[k] for k in now}
        assert put_bytes >= 3 * cap, "the kit did not manage to overfill the capacity"
        assert vanished_total, f"{put_bytes} bytes were put into a capacity of {cap}, none left"
        keys = sorted(model)
        for key, data in zip(keys, store.get(keys)):
            if data is None and silent:
                continue
            assert data == model[key], (
                f"at the end, get({key!r}) returned {describe(model[key], data)}"
            )

    def test_block_larger_than_capacity_is_refused(self) -> None:
        cap = self._capacity_or_skip(256 * MIB)
        small = [key_of("fits", i) for i in range(2)]
        blocks = [block_for(k, max(1, min(100, cap // 4))) for k in small]
        assert self.store.put(small, blocks) == [True, True], (
            f"a put of two blocks of {len(blocks[0])} bytes was refused under a capacity of {cap}"
        )
        big = key_of("too-big", 0)
        evicted: list[tuple[bytes, bytes]] = []
        assert self.store.put([big], [bytes(cap + 1)], evicted) == [False], (
            f"a block of {cap + 1} bytes is larger than the capacity and must be refused"
        )
        assert self.store.lookup([big]) == [False], (
            f"lookup({big!r}) answered True for a block whose put was refused"
        )
        assert self.store.get([big]) == [None], (
            f"get({big!r}) returned data for a block whose put was refused"
        )
        lost = {k for k, _ in evicted}
        for key, want, have in zip(small, blocks, self.store.get(small)):
            if key in lost or (have is None and not self.caps.reports_evictions):
                continue
            assert have == want, f"get({key!r}) returned {describe(want, have)}"
        self._capacity_used_within(cap, "after the refused block")

    def _capacity_overfill(
        self, tag: str, cap: int, evicted: list[tuple[bytes, bytes]]
    ) -> list[bytes]:
        """Put blocks of a quarter of the capacity (at most 1 MiB) until 3 capacities went in."""
        size = max(1, min(cap // 4, MIB, self.block_limit() or cap))
        keys = [key_of(tag, i) for i in range(3 * cap // size + 1)]
        for key in keys:
            assert self.store.put([key], [block_for(key, size)], evicted) == [True], (
                f"a put of {size} bytes was refused under a capacity of {cap}"
            )
        return keys

    def test_evicted_keys_are_not_reported_by_later_puts(self) -> None:
        if not self.caps.reports_evictions:
            pytest.skip(f"backend {self.backend!r} does not declare reports_evictions=True")
        cap = self._capacity_or_skip(MAX_FILLED_CAPACITY)
        gone = [key_of("removed", i) for i in range(3)]
        blocks = [block_for(k, max(1, min(1000, cap // 8))) for k in gone]
        assert self.store.put(gone, blocks) == [True] * 3, "a put within the capacity refused"
        assert self.store.evict(gone) == [True] * 3, "evict of three stored keys"
        evicted: list[tuple[bytes, bytes]] = []
        self._capacity_overfill("after-evict", cap, evicted)
        assert evicted, f"3 capacities of blocks went into a capacity of {cap}; none reported"
        again = sorted({k for k, _ in evicted} & set(gone))
        assert not again, (
            f"{again} were removed by kvtier_evict and then reported in evicted by a later "
            "put: evicted is only for blocks the capacity pushed out, and a tier below "
            "would store again what kvtier asked to remove"
        )

    def test_evictions_figure_counts_capacity_evictions(self) -> None:
        cap = self._capacity_or_skip(MAX_FILLED_CAPACITY)
        before = self.store.stats().get("evictions")
        if before is None:
            pytest.skip(f"backend {self.backend!r} reports no evictions figure in stats()")
        evicted: list[tuple[bytes, bytes]] = []
        keys = self._capacity_overfill("figure", cap, evicted)
        if self.caps.reports_evictions:
            pushed = len({k for k, _ in evicted})
        else:
            pushed = self._capacity_present(keys, "after 3 capacities").count(False)
        after = self.store.stats().get("evictions")
        assert after is not None, "stats() dropped the evictions figure after puts"
        assert pushed, f"3 capacities of blocks went into a capacity of {cap}; none left"
        assert after - before >= pushed, (
            f"stats() evictions went from {before} to {after} while the capacity pushed out "
            f"{pushed} blocks: the figure counts the blocks removed to make room"
        )
