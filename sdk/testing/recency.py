"""Group ``recency``: a lookup is not a use, for a backend that evicts the least recently used.

The contract counts ``kvtier_get``, ``kvtier_get_into`` and a put of a stored
key as uses, and ``kvtier_lookup`` not: the chain probes every tier with
lookups, and a probe that refreshed a block would keep cold blocks in a full
tier.  The group runs for a backend that declares a capacity and
``extra["eviction"] == "lru"`` over the whole namespace.
"""

from __future__ import annotations

import pytest

from .base import KitBase, kit_group
from .data import MIB, block_for, key_of

__all__ = ["RecencyTests"]

#: Largest capacity the group fills.
MAX_FILLED = 64 * MIB
#: Blocks of equal size that fill the capacity.
BLOCKS_PER_CAPACITY = 8


@kit_group("recency")
class RecencyTests(KitBase):
    """Runs when the backend declares a capacity and ``eviction=lru`` (see :mod:`.groups`)."""

    def _recency_present(self, keys: list[bytes]) -> list[bool]:
        # in put order: a backend that refreshes on a read keeps that order all the same
        if self.lookup_exact:
            return self.store.lookup(keys)
        return [block is not None for block in self.store.get(keys)]

    def test_lookup_is_not_a_use(self) -> None:
        cap = self.caps.capacity
        assert cap is not None  # the group is skipped otherwise
        if cap > MAX_FILLED:
            pytest.skip(f"capacity {cap} bytes is too large for the kit to fill; "
                        f"configure at most {MAX_FILLED} bytes for the kit")
        size = max(1, min(cap // BLOCKS_PER_CAPACITY, self.block_limit() or cap))
        keys: list[bytes] = []
        # fill block by block (one put each: the order of use is the order of put)
        # until the first eviction: the store is full, its oldest block next to go
        while len(keys) < 4 * BLOCKS_PER_CAPACITY + 4:
            key = key_of("recency", len(keys))
            keys.append(key)
            assert self.store.put([key], [block_for(key, size)]) == [True], (
                f"put of {size} bytes refused under a capacity of {cap}"
            )
            present = self._recency_present(keys)
            if not all(present):
                break
        else:
            raise AssertionError(f"{len(keys)} blocks of {size} bytes never filled {cap} bytes")
        held = [k for k, here in zip(keys, present) if here]
        assert len(held) >= 2, f"a capacity of {cap} bytes held {len(held)} blocks of {size}"
        oldest, next_oldest = held[0], held[1]
        found = self.store.lookup([oldest])  # the lookup under test
        assert found == [True] or not self.lookup_exact, f"lookup({oldest!r}) of a held block"
        newest = key_of("recency", len(keys))
        assert self.store.put([newest], [block_for(newest, size)]) == [True]
        # the answer is read with get, oldest first: a read of a miss refreshes nothing
        first, second = self.store.get([oldest, next_oldest])
        assert first is None or second is None, (
            f"a put into the full store removed neither of the two oldest blocks "
            f"({oldest!r}, {next_oldest!r}): it does not evict the least recently used"
        )
        assert first is None, (
            f"after a lookup of the oldest block {oldest!r}, the next put evicted "
            f"{next_oldest!r} and kept {oldest!r}: the lookup refreshed its recency, "
            "and a lookup is not a use"
        )
        assert second is None or second == block_for(next_oldest, size), (
            f"get({next_oldest!r}) returned other bytes than were put"
        )
