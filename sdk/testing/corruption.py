"""Group ``corruption``: damaged stored bytes are a miss through a chain, never data.

The chain frames every block with a header and checksum
(:mod:`kvtier.block.framing`); here the kit damages the raw stored bytes
through the kit's raw access (:meth:`~kvtier.testing.BackendTests.tamper`,
:mod:`kvtier.testing.raw`) and checks that the chain over this backend turns
each kind of damage into a counted miss, while the neighbours still read
back exactly.  A backend passes when its raw access really reaches what
``kvtier_get``/``kvtier_get_into`` serve (no cache hides the damage) and it
serves whatever bytes it holds, whatever their length.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvtier import Chain

from .base import KitBase, kit_group
from .data import block_for, describe, key_of

__all__ = ["CorruptionTests"]

#: Size of the blocks the group damages (small enough for any capacity).
SIZE = 3000
_PREFIX = 6  # magic (4 bytes) and header length (u16) before the msgpack header


def _flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0xFF
    return bytes(out)


def _damages(namespace: bytes, other: bytes) -> dict[str, Callable[[bytes], bytes]]:
    def payload_byte(stored: bytes) -> bytes:
        return _flip(stored, len(stored) - SIZE // 2)  # the middle of the payload

    def header_byte(stored: bytes) -> bytes:
        # a byte of the namespace fingerprint inside the msgpack header
        at = stored.find(namespace, _PREFIX)
        assert at > 0, "the stored block does not carry the chain's header"
        return _flip(stored, at + 3)

    return {
        "payload_byte": payload_byte,
        "header_byte": header_byte,
        "magic_byte": lambda stored: _flip(stored, 0),
        "truncated": lambda stored: stored[:-1],
        "truncated_to_half": lambda stored: stored[: len(stored) // 2],
        "appended": lambda stored: stored + b"\x00",
        "other_keys_bytes": lambda stored: other,
    }


DAMAGES = list(_damages(b"", b""))


@kit_group("corruption")
class CorruptionTests(KitBase):
    """Runs when the kit has raw access to the backend: ``kit_tamper``, or ``tamper`` overridden."""

    def _corruption_count(self, chain: Chain) -> int:
        return int(chain.stats()["tiers"][0]["corrupt"])

    @pytest.mark.parametrize("damage", DAMAGES)
    def test_damaged_block_is_a_counted_miss(self, damage: str) -> None:
        self.store.close()  # the chain opens its own instance on the same store
        chain = self.open_chain()
        keys = [key_of("tamper", i) for i in range(4)]
        blocks = [block_for(k, SIZE) for k in keys]
        assert chain.put(keys, blocks) == [True] * 4, "a chain over the backend refused 4 puts"
        chain.flush()
        handle = chain.tiers[0].handle
        instance = handle.instance
        victim, other = keys[1], keys[2]
        (other_stored,) = handle.get([other])
        assert other_stored is not None, f"{other!r} was put through the chain but is not stored"
        transform = _damages(chain.namespace.fingerprint, bytes(other_stored))[damage]
        assert self.tamper(instance, victim, transform) is True, (
            "tamper of a stored key: not True"
        )

        before = self._corruption_count(chain)
        out = bytearray(SIZE)
        assert chain.get([victim], [out]) == [False], (
            f"{damage}: Chain.get served a damaged block as data"
        )
        after_get = self._corruption_count(chain)
        assert after_get > before, f"{damage}: Chain.get did not count the damaged block as corrupt"
        assert chain.lookup([victim]) == [None], (
            f"{damage}: the rejected block was not dropped: lookups still find it"
        )
        # stored and damaged again, for the other read path
        assert chain.put([victim], [blocks[1]]) == [True], "a chain over the backend refused a put"
        chain.flush()
        assert self.tamper(instance, victim, transform) is True, (
            "tamper of a stored key: not True"
        )
        assert chain.get_bytes([victim]) == [None], (
            f"{damage}: Chain.get_bytes served a damaged block as data"
        )
        assert self._corruption_count(chain) > after_get, (
            f"{damage}: Chain.get_bytes did not count the damaged block as corrupt"
        )

        neighbours = [keys[0], keys[2], keys[3]]
        wanted = [blocks[0], blocks[2], blocks[3]]
        outs = [bytearray(SIZE) for _ in neighbours]
        assert chain.get(neighbours, outs) == [True] * 3, f"{damage}: a neighbour was lost"
        for key, want, out in zip(neighbours, wanted, outs):
            assert out == want, f"{damage}: {key!r} read back {describe(want, bytes(out))}"
        for key, want, got in zip(neighbours, wanted, chain.get_bytes(neighbours)):
            assert got == want, f"{damage}: get_bytes({key!r}) returned {describe(want, got)}"

    def test_tamper_of_an_unknown_key_answers_false(self) -> None:
        answer = self.tamper(self.store.handle.instance, key_of("tamper", 99), lambda b: b)
        assert answer is False, f"tamper of a key never stored answered {answer!r}, not False"
