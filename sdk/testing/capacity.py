"""Group ``capacity``: a declared capacity holds, and what it pushes out is reported exactly."""

from __future__ import annotations

import pytest

from .base import KitBase
from .data import MIB, block_for, describe, key_of

__all__ = ["CapacityTests"]

group = pytest.mark.kvtier_group("capacity")

#: Largest capacity the kit fills (three times over) in a test.
MAX_FILLED_CAPACITY = 64 * MIB


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

    def _capacity_present(self, keys: list[bytes]) -> list[bool]:
        # lookup is cheaper; a backend whose lookup may be stale is asked with get
        if self.lookup_exact:
            return self.store.lookup(keys)
        return [block is not None for block in self.store.get(keys)]

    def _capacity_used_within(self, cap: int, note: str) -> None:
        used = self.store.stats().get("used_bytes")
        if used is not None:
            assert used <= cap, f"{note}: stats() reports used_bytes={used} > capacity {cap}"

    @group
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
            now = {k for k, here in zip(order, self._capacity_present(order)) if here}
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
                assert not unreported, (
                    f"step {step}: {unreported[:3]} vanished without being reported in evicted"
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

    @group
    def test_block_larger_than_capacity_is_refused(self) -> None:
        cap = self._capacity_or_skip(256 * MIB)
        small = [key_of("fits", i) for i in range(2)]
        blocks = [block_for(k, max(1, min(100, cap // 4))) for k in small]
        assert self.store.put(small, blocks) == [True, True]
        big = key_of("too-big", 0)
        evicted: list[tuple[bytes, bytes]] = []
        assert self.store.put([big], [bytes(cap + 1)], evicted) == [False], (
            f"a block of {cap + 1} bytes is larger than the capacity and must be refused"
        )
        assert self.store.lookup([big]) == [False]
        assert self.store.get([big]) == [None]
        lost = {k for k, _ in evicted}
        for key, want, have in zip(small, blocks, self.store.get(small)):
            if key in lost or (have is None and not self.caps.reports_evictions):
                continue
            assert have == want, f"get({key!r}) returned {describe(want, have)}"
        self._capacity_used_within(cap, "after the refused block")
