"""The ``peer`` backend's consistent-hash ring: which peer owns a key under ``hash`` placement.

Each peer has :data:`VNODES` points on a BLAKE2b ring; a key belongs to the
peer of the first point after the key's hash.  Capacity adds up across peers,
and adding or removing a peer moves only about 1/N of the keys.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence

__all__ = ["VNODES", "Ring"]

VNODES = 64


def _ring_hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class Ring:
    """The ring of the peers named ``labels``; owners are indices into ``labels``."""

    def __init__(self, labels: Sequence[str]) -> None:
        points = sorted((_ring_hash(f"{label}#{v}".encode()), index)
                        for index, label in enumerate(labels) for v in range(VNODES))
        self._hashes = [h for h, _ in points]
        self._owners = [i for _, i in points]

    def by_owner(self, keys: Sequence[bytes], indices: list[int]) -> dict[int, list[int]]:
        """The ``indices`` of ``keys`` grouped by the peer owning each key."""
        groups: dict[int, list[int]] = {}
        ring, owners = self._hashes, self._owners
        for i in indices:
            point = bisect.bisect(ring, _ring_hash(keys[i])) % len(ring)
            groups.setdefault(owners[point], []).append(i)
        return groups
