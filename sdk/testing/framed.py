"""Group ``framed``: a backend declaring ``framed_only`` keeps its word both ways.

Such a backend (``peer``) stores only blocks framed by a chain for the
namespace it was opened with, and the kit's other groups, which put raw
bytes, are certified through a chain of one tier instead
(:class:`~kvtier.testing.through_chain.ChainOfOne`).  This group talks to
the backend itself: raw bytes and a frame of another namespace are refused
(``False``, then misses), and a frame of its own namespace is stored and
comes back byte for byte.
"""

from __future__ import annotations

import secrets

from kvtier.block import framing

from .base import KitBase, kit_group
from .data import block_for, describe, key_of, shown

__all__ = ["FramedTests"]


@kit_group("framed")
class FramedTests(KitBase):
    """Runs when ``Capabilities.framed_only`` is declared."""

    def _framed(self, namespace: str, key: bytes, size: int) -> bytes:
        payload = block_for(key, size)
        return framing.encode(bytes.fromhex(namespace), key, payload, framing.Codec())

    def test_unframed_blocks_are_refused(self) -> None:
        raw, foreign = key_of("raw", 0), key_of("raw", 1)
        blocks = [block_for(raw, 5000), self._framed(secrets.token_hex(16), foreign, 5000)]
        flags = self.store.put([raw, foreign], blocks)
        assert flags == [False, False], (
            f"put of raw bytes and of a frame of another namespace answered {flags}; a "
            "backend declaring framed_only=True refuses both"
        )
        got = self.store.get([raw, foreign])
        assert got == [None, None], (
            f"get returned {shown(got)} where [None, None] was expected: "
            "a block reads back exactly as stored, and a key not stored is a miss"
        )
        flags = self.store.lookup([raw, foreign])
        assert flags == [False, False], (
            f"lookup answered {flags} where [False, False] was expected: "
            "lookup answers True exactly for the keys stored"
        )

    def test_framed_blocks_are_stored(self) -> None:
        keys = [key_of("framed", i) for i in range(3)]
        frames = [self._framed(self.namespace, k, size) for k, size in zip(keys, (1, 5000, 70_001))]
        assert self.store.put(keys, frames) == [True] * 3, (
            "a backend declaring framed_only=True refused blocks framed for its namespace"
        )
        for key, want, have in zip(keys, frames, self.store.get(keys)):
            assert have == want, f"get({key!r}) of a framed block returned {describe(want, have)}"
        flags = self.store.evict(keys[:1])
        assert flags == [True], (
            f"evict answered {flags} where [True] was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        got = self.store.get(keys[:1])
        assert got == [None], (
            f"get returned {shown(got)} where [None] was expected: "
            "a block reads back exactly as stored, and a key not stored is a miss"
        )
