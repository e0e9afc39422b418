"""Admission to the tiers below the first: a block is written down once its key was seen enough,
or at first sight when its prompt lineage is among a sampled share.

A tier's ``admit: N`` (default 1: every block) lets the chain's traffic write
a block to that tier, by ``through`` or by demotion (``back``), only once the
chain has seen its key in at least ``N`` calls (lookups, gets, puts; each
call counts a key once).  Blocks used once, the tail of a one-off prompt,
then cost no SSD write or object PUT; what a RAM tier still holds at close
is saved below as before.

The counts live in a count-min sketch (Cormode and Muthukrishnan, 2005):
four rows of one-byte counters indexed by parts of the key's xxh3-128 hash,
an estimate being the smallest of the four, never below the true count.
After ``10 x width`` counts every counter is halved (TinyLFU's reset, Einziger
et al., 2017), so popularity fades and the counters never saturate for long.

A count cannot tell, when RAM lets a block go after one sighting, whether it
will come back; a conversation's next turn often does, long after.  A tier's
``admit_sample: F`` therefore also writes, at first sight, the blocks of a
share ``F`` of prompt lineages (:class:`Lineage`).  Sampling whole lineages
rather than blocks matters: a prompt's cached prefix ends at its first
missing block, so a refused block in the middle of a kept conversation would
waste every block kept after it.

The chain holds one :class:`Admission` (:mod:`kvtier.chain.traffic`), and
``kvtier plan`` replays the same (:mod:`kvtier.plan.below`); the options'
check of ``admit_sample`` against ``admit`` is the configuration's
(:func:`kvtier.config.chain_config.sample_problem`).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence

import numpy as np
import xxhash

__all__ = ["Admission", "Lineage", "Seen"]

_ROWS = 4
_WIDTH_BITS = 16  # 65,536 counters a row: 256 KiB in all
_LINEAGE_BITS = 20  # 1,048,576 slots of 4 bytes: 4 MiB
#: Calls naming a parent after which its new children start lineages of their own:
#: a prefix named by three prompts (two calls each) is shared, not one conversation's.
_SHARED_CALLS = 6
_DRAWS = 1 << 16  # a lineage's draw is uniform in [0, _DRAWS)


class Seen:
    """How many calls named each key, approximately (never fewer)."""

    def __init__(self, width_bits: int = _WIDTH_BITS) -> None:
        self._bits = width_bits
        self._mask = (1 << width_bits) - 1
        self._counts = bytearray(_ROWS << width_bits)
        self._added = 0
        self._reset_at = 10 << width_bits
        self._lock = threading.Lock()

    def _slots(self, key: bytes) -> list[int]:
        h, bits, mask = xxhash.xxh3_128_intdigest(key), self._bits, self._mask
        return [(row << bits) | ((h >> (32 * row)) & mask) for row in range(_ROWS)]

    def note(self, keys: Sequence[bytes]) -> None:
        """One call named ``keys`` (a key repeated in it counts once)."""
        unique = set(keys)
        slots = [self._slots(key) for key in unique]
        with self._lock:
            counts = self._counts
            for row_slots in slots:
                for slot in row_slots:
                    if counts[slot] < 255:
                        counts[slot] += 1
            self._added += len(unique)
            if self._added >= self._reset_at:
                view = np.frombuffer(counts, dtype=np.uint8)
                np.right_shift(view, 1, out=view)
                self._added //= 2

    def count(self, key: bytes) -> int:
        counts = self._counts
        with self._lock:
            return min(counts[slot] for slot in self._slots(key))


class Lineage:
    """Each key's lineage draw: a conversation's blocks share one, so sampling keeps them whole.

    A call names a prompt's keys in order.  A key met for the first time
    joins the lineage of the key before it in the call (its parent), unless
    it comes first in the call or its parent is shared (named in
    :data:`_SHARED_CALLS` calls or more: a system prompt); then it starts a
    lineage of its own, whose draw comes from its hash.  The draws live in a
    fixed table of 4-byte slots (a 16-bit fingerprint, a 16-bit draw), where
    a newer key may take an older one's slot: a key that lost its slot is
    drawn afresh, which costs sampling consistency, never correctness.
    """

    def __init__(self, seen: Seen, slot_bits: int = _LINEAGE_BITS) -> None:
        self._seen = seen
        self._mask = (1 << slot_bits) - 1
        self._slots = array("I", bytes(4 << slot_bits))
        self._lock = threading.Lock()

    def _hash(self, key: bytes) -> tuple[int, int]:
        """``key``'s slot and its entry's fingerprint (never 0: 0 is an empty slot)."""
        h = xxhash.xxh3_64_intdigest(key)
        return h & self._mask, ((h >> 48) | 1) << 16

    @staticmethod
    def _own_draw(key: bytes) -> int:
        return xxhash.xxh32_intdigest(key) & (_DRAWS - 1)

    def note(self, keys: Sequence[bytes]) -> None:
        """A call named ``keys`` in prompt order: give the new ones a lineage."""
        slots, count = self._slots, self._seen.count
        parent: bytes | None = None  # the key before
        parent_draw = 0
        with self._lock:
            for key in keys:
                slot, mark = self._hash(key)
                entry = slots[slot]
                if entry >> 16 == mark >> 16:
                    draw = entry & (_DRAWS - 1)
                else:  # counted only here: a lookup of known keys costs two hashes a key
                    inherits = parent is not None and count(parent) < _SHARED_CALLS
                    draw = parent_draw if inherits else self._own_draw(key)
                    slots[slot] = mark | draw
                parent, parent_draw = key, draw

    def draw(self, key: bytes) -> int:
        """``key``'s lineage draw in ``[0, 65536)``: its own hash's if not (or no longer) known."""
        slot, mark = self._hash(key)
        entry = self._slots[slot]
        return entry & (_DRAWS - 1) if entry >> 16 == mark >> 16 else self._own_draw(key)

    def sampled(self, key: bytes, share: float) -> bool:
        """Whether ``key``'s lineage is among a share ``share`` of lineages (the same for all)."""
        return self.draw(key) < share * _DRAWS


class Admission:
    """What the tiers below the first let in: counts (``admit``) and lineages
    (``admit_sample``), kept only where some tier asks for them."""

    def __init__(self, admits: Sequence[int], samples: Sequence[float]) -> None:
        self._admits, self._samples = list(admits), list(samples)
        self._seen = Seen() if any(n > 1 for n in admits) else None
        self._lineage = (Lineage(self._seen) if self._seen is not None
                         and any(samples) else None)

    def note(self, keys: Sequence[bytes]) -> None:
        """A caller's call named ``keys``, in prompt order."""
        if self._seen is not None:
            self._seen.note(keys)
            if self._lineage is not None:
                self._lineage.note(keys)

    def admitted(self, index: int, keys: Sequence[bytes]) -> tuple[list[bool], int]:
        """Whether tier ``index`` lets in each of ``keys``, and how many of them only
        because their lineage is sampled."""
        need, share = self._admits[index], self._samples[index]
        if need <= 1 or self._seen is None:
            return [True] * len(keys), 0
        count, lineage = self._seen.count, self._lineage if share else None
        counted = [count(key) >= need for key in keys]
        if lineage is None:
            return counted, 0
        sampled = [not known and lineage.sampled(key, share)
                   for key, known in zip(keys, counted, strict=True)]
        return [a or b for a, b in zip(counted, sampled, strict=True)], sum(sampled)
