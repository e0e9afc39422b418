"""Group ``shared``: two instances opened with the same options and namespace see one store.

``Capabilities.shared`` promises that a block one instance stores is a hit
for another's ``kvtier_get`` and that an evict by one is seen by all.  The
group opens a second instance beside the test's own, before the first puts
anything (so nothing it cached or indexed at open can answer for it), and
reads each instance's writes through the other, byte for byte.  Lookups may
lag by a short-lived cache, so the group asks ``kvtier_get``, the authority.
With a capacity, two instances putting in turn hold no more than it together.
"""

from __future__ import annotations

import pytest

from .base import KitBackend, KitBase, kit_group
from .data import MIB, block_for, describe, key_of, size_for
from .groups import capacity_scope_of

__all__ = ["SharedTests"]

#: Largest capacity the group fills (three times over, through two instances).
MAX_FILLED = 64 * MIB


@kit_group("shared")
class SharedTests(KitBase):
    """Runs when ``Capabilities.shared`` is declared."""

    def _shared_blocks(self, tag: str, count: int) -> tuple[list[bytes], list[bytes]]:
        keys = [key_of(tag, i) for i in range(count)]
        return keys, [block_for(k, size_for(k, self.block_limit())) for k in keys]

    def _shared_check(
        self, reader: KitBackend, keys: list[bytes], want: list[bytes | None], what: str
    ) -> None:
        for key, expected, have in zip(keys, want, reader.get(keys)):
            assert have == expected, (
                f"{what}: the other instance's get({key!r}) returned {describe(expected, have)}; "
                "a backend declaring shared=True is one store for every instance"
            )

    def test_a_put_by_one_is_a_hit_for_the_other(self) -> None:
        one, other = self.store, self.open_backend()
        keys, blocks = self._shared_blocks("shared-put", 4)
        answer = one.put(keys[:2], blocks[:2])
        assert answer == [True, True], (
            f"put answered {answer} where [True, True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        self._shared_check(other, keys[:2], list(blocks[:2]), "after a put by the first")
        answer = other.put(keys[2:], blocks[2:])
        assert answer == [True, True], (
            f"put answered {answer} where [True, True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        self._shared_check(one, keys, list(blocks), "after a put by the second")

    def test_an_evict_by_one_is_a_miss_for_the_other(self) -> None:
        one, other = self.store, self.open_backend()
        keys, blocks = self._shared_blocks("shared-evict", 4)
        answer = one.put(keys, blocks)
        assert answer == [True] * 4, (
            f"put answered {answer} where [True] * 4 was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        # both have read every block: whatever they cache or index holds it now
        self._shared_check(other, keys, list(blocks), "after a put by the first")
        self._shared_check(one, keys, list(blocks), "after a put by the first, read by itself")
        answer = one.evict(keys[:1])
        assert answer == [True], (
            f"evict answered {answer} where [True] was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        answer = other.evict(keys[1:2])
        assert answer == [True], (
            f"evict answered {answer} where [True] was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        want: list[bytes | None] = [None, None, *blocks[2:]]
        self._shared_check(other, keys, want, "after an evict by each")
        self._shared_check(one, keys, want, "after an evict by each")

    def test_capacity_holds_for_all_instances_together(self) -> None:
        cap = self.caps.capacity
        if cap is None:
            pytest.skip(f"backend {self.backend!r} declares no capacity")
        if capacity_scope_of(self.caps) == "process":
            pytest.skip(f"backend {self.backend!r} declares capacity_scope=process: each "
                        "process bounds its own capacity")
        if cap > MAX_FILLED:
            pytest.skip(f"capacity {cap} bytes is too large for the kit to fill; "
                        f"configure at most {MAX_FILLED} bytes for the kit")
        one, other = self.store, self.open_backend()
        size = max(1, min(cap // 8, MIB, self.block_limit() or cap))
        keys = [key_of("shared-cap", i) for i in range(3 * cap // size + 2)]
        for i, key in enumerate(keys):
            writer = (one, other)[i % 2]
            assert writer.put([key], [block_for(key, size)]) == [True], (
                f"a put of {size} bytes was refused under a capacity of {cap}"
            )
        held = [k for k, b in zip(keys, one.get(keys)) if b is not None]
        assert len(held) * size <= cap, (
            f"two instances of one shared store, putting {len(keys)} blocks of {size} bytes "
            f"in turn, left {len(held)} of them ({len(held) * size} bytes) in a capacity of "
            f"{cap}: a shared store's capacity holds for all its instances together"
        )
