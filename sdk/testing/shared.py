"""Group ``shared``: two instances opened with the same options and namespace see one store.

``Capabilities.shared`` promises that a block one instance stores is a hit
for another's ``kvtier_get`` and that an evict by one is seen by all.  The
group opens a second instance beside the test's own, before the first puts
anything (so nothing it cached or indexed at open can answer for it), and
reads each instance's writes through the other, byte for byte.  Lookups may
lag by a short-lived cache, so the group asks ``kvtier_get``, the authority.
"""

from __future__ import annotations

from .base import KitBackend, KitBase, kit_group
from .data import block_for, describe, key_of, size_for

__all__ = ["SharedTests"]


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
        assert one.put(keys[:2], blocks[:2]) == [True, True]
        self._shared_check(other, keys[:2], list(blocks[:2]), "after a put by the first")
        assert other.put(keys[2:], blocks[2:]) == [True, True]
        self._shared_check(one, keys, list(blocks), "after a put by the second")

    def test_an_evict_by_one_is_a_miss_for_the_other(self) -> None:
        one, other = self.store, self.open_backend()
        keys, blocks = self._shared_blocks("shared-evict", 4)
        assert one.put(keys, blocks) == [True] * 4
        # both have read every block: whatever they cache or index holds it now
        self._shared_check(other, keys, list(blocks), "after a put by the first")
        self._shared_check(one, keys, list(blocks), "after a put by the first, read by itself")
        assert one.evict(keys[:1]) == [True]
        assert other.evict(keys[1:2]) == [True]
        want: list[bytes | None] = [None, None, *blocks[2:]]
        self._shared_check(other, keys, want, "after an evict by each")
        self._shared_check(one, keys, want, "after an evict by each")
