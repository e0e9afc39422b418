"""Admission to the tiers below the first: a block is written down once its key was seen enough.

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
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import xxhash

__all__ = ["Seen"]

_ROWS = 4
_WIDTH_BITS = 16  # 65,536 counters a row: 256 KiB in all


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
