"""Group ``keep``: ``kvtier_keep`` marks blocks kept, no victims while marked (contract 1.2).

The answers: per key True, False (refused for the tenant's retention budget)
or None (not stored); a release of a stored block answers True.  A mark
changes nothing a read sees: the kept block reads back exact.  Where the
backend declares a capacity and keeps a block (its options give a ``keep``
budget), the kit fills the capacity three times over with other blocks: the
kept block is still there, byte for byte; released, it may go again.  A
backend whose options give no budget refuses every mark, which the kit
accepts and says in the skip of the capacity test.
"""

from __future__ import annotations

import pytest

from .base import KitBase, kit_group
from .data import MIB, block_for, key_of

__all__ = ["KeepTests"]

#: Largest capacity the kit fills (three times over) around a kept block.
MAX_FILLED_CAPACITY = 64 * MIB


@kit_group("keep")
class KeepTests(KitBase):
    """Runs for backends that implement ``kvtier_keep``."""

    def _keep(self, keys: list[bytes], keep: bool) -> list[bool | None]:
        answer = self.store.handle.keep(keys, keep)  # checks the batch's length
        for flag in answer:
            assert flag is None or isinstance(flag, bool), (
                f"{self.label}: kvtier_keep answered {flag!r}: expected True, False or None")
        return answer

    @property
    def label(self) -> str:
        return f"backend {self.backend!r}"

    def test_answers_per_key_and_a_mark_changes_no_read(self) -> None:
        stored, absent = key_of("keep", 0), key_of("keep-absent", 0)
        data = block_for(stored, 4096)
        assert self.store.put([stored], [data]) == [True]
        assert self._keep([], True) == []
        kept = self._keep([stored, absent], True)
        assert kept[1] is None, f"kvtier_keep of a key never stored answered {kept[1]!r}"
        assert kept[0] in (True, False), (
            f"kvtier_keep of a stored block answered {kept[0]!r}: True (kept) or False "
            "(refused for the budget)")
        assert self.store.get([stored]) == [data], "a kept block must read back exact"
        assert self.store.lookup([stored]) == [True]
        assert self._keep([stored, absent], False) == [True, None], (
            "a release answers True for a stored block (marked or not), None for a key "
            "not stored")
        assert self.store.get([stored]) == [data]

    def test_a_kept_block_is_no_victim_of_the_capacity(self) -> None:
        cap = self.caps.capacity
        if cap is None:
            pytest.skip(f"{self.label} declares no capacity: nothing evicts")
        if cap > MAX_FILLED_CAPACITY:
            pytest.skip(f"capacity {cap} bytes is too large for the kit to fill")
        size = max(1, min(cap // 8, MIB))
        kept = key_of("keep-kept", 0)
        data = block_for(kept, size)
        assert self.store.put([kept], [data]) == [True]
        if self._keep([kept], True) != [True]:
            pytest.skip(f"{self.label} refused to keep one block of {size} bytes: its "
                        "options give no keep budget (tenants: {'*': {keep: ...}})")
        filled, i = 0, 0
        while filled < 3 * cap:
            key = key_of("keep-fill", i)
            flags = self.store.put([key], [block_for(key, size)])
            assert flags in ([True], [False]), flags
            filled, i = filled + size, i + 1
        assert self.store.get([kept]) == [data], (
            f"the kept block left after {filled} bytes were put into a capacity of {cap}: "
            "a kept block is never a victim while marked")
        assert self._keep([kept], False) == [True]
        filled = 0
        while filled < 3 * cap:
            key = key_of("keep-refill", i)
            self.store.put([key], [block_for(key, size)])
            filled, i = filled + size, i + 1
        held = self.store.get([kept])
        assert held in ([None], [data]), "a released block is exact or gone"
