"""Group ``recency``: what is a use, for a backend that evicts the least recently used.

The contract counts ``kvtier_get``, ``kvtier_get_into`` and a put of a stored
key as uses, and ``kvtier_lookup`` and ``kvtier_scan`` not: the chain probes
every tier with lookups, and a probe that refreshed a block would keep cold
blocks in a full tier.  Each check fills the store until its first eviction,
does one thing to the oldest block, puts one more block and sees which of
the two oldest went.  Recency belongs to the instance's namespace: a use in
another namespace (recency kept at class level, keyed by key alone) saves
nothing here.  The group runs for a backend that declares a capacity and
``eviction="lru"`` over the whole namespace (``capacity_scope`` ``namespace``
or ``process``).
"""

from __future__ import annotations

import secrets

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

    def _recency_full(self, tag: str) -> tuple[int, list[bytes], bytes, bytes]:
        """Fill the store block by block until its first eviction.

        Answers the block size, the keys put, and the two oldest blocks still
        held: the next put of a block of that size removes the oldest.
        """
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
            key = key_of(tag, len(keys))
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
        return size, keys, held[0], held[1]

    def _recency_next_put(self, tag: str, size: int, keys: list[bytes]) -> None:
        newest = key_of(tag, len(keys))
        assert self.store.put([newest], [block_for(newest, size)]) == [True], (
            f"put of {size} bytes into the full store refused"
        )

    def _recency_survivor(
        self, size: int, oldest: bytes, next_oldest: bytes, what: str, *, used: bool
    ) -> None:
        """After the next put: the refreshed ``oldest`` stays (``used``), or goes first."""
        # read oldest first: a read of a miss refreshes nothing
        first, second = self.store.get([oldest, next_oldest])
        if used:
            assert first is not None, (
                f"after {what} of the oldest block {oldest!r}, the next put evicted it: "
                f"{what} did not refresh its recency, and it is a use under eviction=lru"
            )
            assert first == block_for(oldest, size), f"get({oldest!r}) returned other bytes"
            assert second is None, (
                f"after {what} of the oldest block, a put into the full store kept the next "
                f"oldest {next_oldest!r} too: it does not evict the least recently used"
            )
        else:
            assert first is None, (
                f"after {what} of the oldest block {oldest!r}, the next put kept it"
                f"{' and evicted ' + repr(next_oldest) if second is None else ''}: "
                f"{what} refreshed its recency, and it is not a use"
            )
            assert second is None or second == block_for(next_oldest, size), (
                f"get({next_oldest!r}) returned other bytes than were put"
            )

    def test_lookup_is_not_a_use(self) -> None:
        size, keys, oldest, next_oldest = self._recency_full("recency")
        found = self.store.lookup([oldest])  # the lookup under test
        assert found == [True] or not self.lookup_exact, (
            f"lookup({oldest!r}) of a held block answered {found}"
        )
        self._recency_next_put("recency", size, keys)
        self._recency_survivor(size, oldest, next_oldest, "the lookup", used=False)

    def test_get_is_a_use(self) -> None:
        size, keys, oldest, next_oldest = self._recency_full("use-get")
        assert self.store.get([oldest]) == [block_for(oldest, size)], (
            f"get({oldest!r}) of a held block did not return its bytes"
        )
        self._recency_next_put("use-get", size, keys)
        self._recency_survivor(size, oldest, next_oldest, "the get", used=True)

    def test_get_into_is_a_use(self) -> None:
        if not self.store.implements("kvtier_get_into"):
            pytest.skip(f"backend {self.backend!r} does not implement kvtier_get_into")
        size, keys, oldest, next_oldest = self._recency_full("use-into")
        out = bytearray(size)
        assert self.store.get_into([oldest], [[memoryview(out)]]) == [size], (
            f"get_into({oldest!r}) of a held block did not answer its size {size}"
        )
        self._recency_next_put("use-into", size, keys)
        self._recency_survivor(size, oldest, next_oldest, "the get_into", used=True)

    def test_put_of_a_stored_key_is_a_use(self) -> None:
        size, keys, oldest, next_oldest = self._recency_full("use-put")
        assert self.store.put([oldest], [block_for(oldest, size)]) == [True], (
            f"a put of the stored key {oldest!r} must answer True"
        )
        self._recency_next_put("use-put", size, keys)
        self._recency_survivor(size, oldest, next_oldest, "the put of the stored key", used=True)

    def test_scan_is_not_a_use(self) -> None:
        if not self.store.implements("kvtier_scan"):
            pytest.skip(f"backend {self.backend!r} does not implement kvtier_scan")
        size, keys, oldest, next_oldest = self._recency_full("use-scan")
        listed = {entry.key for entry in self.store.scan(self.namespace)}
        assert oldest in listed, f"kvtier_scan did not list the held block {oldest!r}"
        self._recency_next_put("use-scan", size, keys)
        self._recency_survivor(size, oldest, next_oldest, "the scan", used=False)

    def test_another_namespace_uses_nothing_here(self) -> None:
        size, keys, oldest, next_oldest = self._recency_full("use-other")
        # the same key used in another namespace, through another instance: recency
        # kept at class level, or keyed by key alone, lets that save this block
        other = self.open_backend(secrets.token_hex(16))
        small = block_for(oldest + b"/other", min(size, 100))
        assert other.put([oldest], [small]) == [True], "a put into another namespace refused"
        assert other.get([oldest]) == [small], "another namespace's block did not read back"
        self._recency_next_put("use-other", size, keys)
        self._recency_survivor(
            size, oldest, next_oldest, "the put and get (in another namespace, of the same key)",
            used=False,
        )
