"""Several partitions in one tier: a policy per partition under its quota, all under the capacity.

The shape the tenants' quotas take (module docstring of :mod:`.base`): a
:class:`Partitioned` is itself a :class:`~kvtier.policies.Policy`, so a tier
holds it as it holds any other.  Each key belongs to one partition for its
life (``partition_of(key)``: a tenant's keys are namespaced); each partition
runs its own policy of the chosen ``eviction``, whose capacity is the
partition's quota (the tier's capacity where none is set), so a partition
that fills its quota evicts its own blocks in its policy's order and never
another partition's.  When the partitions together exceed the tier's
capacity, the partition holding the most bytes beyond its fair share
(capacity / partitions known) gives up its next victims.  ``used_by(p)`` is a
partition's bytes; ``stats()`` adds each partition's as
``partition_used_<p>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

from .base import Policy
from .registry import new_policy

__all__ = ["Partitioned"]


class Partitioned:
    """Partitions of one capacity, each with its own ``eviction`` policy bounded by its quota.

    A caller admits a key of at most :meth:`limit` bytes (its partition's quota), as
    any policy's caller admits at most its capacity.
    """

    name: ClassVar[str] = "partitioned"

    def __init__(self, eviction: str, capacity: int, partition_of: Callable[[bytes], str],
                 quotas: Mapping[str, int] | None = None) -> None:
        self.eviction = eviction
        self.capacity = capacity
        self.evictions = 0
        self._partition_of = partition_of
        self._quotas = dict(quotas or {})
        self._parts: dict[str, Policy] = {}

    def limit(self, key: bytes) -> int:
        """The largest block ``key``'s partition can hold: its quota."""
        return min(self._quotas.get(self._partition_of(key), self.capacity), self.capacity)

    @property
    def used(self) -> int:
        return sum(part.used for part in self._parts.values())

    def used_by(self, partition: str) -> int:
        part = self._parts.get(partition)
        return 0 if part is None else part.used

    def __len__(self) -> int:
        return sum(len(part) for part in self._parts.values())

    def holds(self, keys: Sequence[bytes]) -> list[bool]:
        return [self.size(key) is not None for key in keys]

    def size(self, key: bytes) -> int | None:
        part = self._parts.get(self._partition_of(key))
        return None if part is None else part.size(key)

    def held(self) -> list[tuple[bytes, int]]:
        return [entry for part in self._parts.values() for entry in part.held()]

    def access(self, key: bytes) -> bool:
        part = self._parts.get(self._partition_of(key))
        return part is not None and part.access(key)

    def admit(self, key: bytes, size: int) -> list[bytes]:
        part = self._own(key)
        if size > part.capacity:
            raise ValueError(f"a block of {size} bytes over its partition's quota "
                             f"({part.capacity})")
        # room in the partition's quota first, from its own blocks; then in the tier,
        # from the partition most beyond its share (this one, maybe); then the admit,
        # which finds the room made
        victims = part.make_room(part.used + size - part.capacity)
        while self.used + size > self.capacity:
            victims += self._largest().make_room(1)
        victims += part.admit(key, size)
        self.evictions += len(victims)
        return victims

    def enter(self, key: bytes, size: int) -> None:
        self._own(key).enter(key, size)

    def remove(self, key: bytes) -> bool:
        part = self._parts.get(self._partition_of(key))
        return part is not None and part.remove(key)

    def resize(self, key: bytes, size: int) -> None:
        self._own(key).resize(key, size)

    def shed(self) -> list[bytes]:
        victims = [key for part in self._parts.values() for key in part.shed()]
        while self.used > self.capacity:
            victims += self._largest().make_room(1)
        self.evictions += len(victims)
        return victims

    def make_room(self, nbytes: int) -> list[bytes]:
        target = max(0, self.used - nbytes)
        victims: list[bytes] = []
        while self.used > target:
            victims += self._largest().make_room(1)
        self.evictions += len(victims)
        return victims

    def stats(self) -> dict[str, int]:
        return {f"partition_used_{name}": part.used for name, part in self._parts.items()}

    def _own(self, key: bytes) -> Policy:
        """``key``'s partition, made on its first key."""
        partition = self._partition_of(key)
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = new_policy(self.eviction, self.limit(key))
        return part

    def _largest(self) -> Policy:
        """The partition holding the most bytes beyond its fair share of the capacity."""
        share = self.capacity // len(self._parts)
        return max((part for part in self._parts.values() if part.used),
                   key=lambda part: part.used - share)
