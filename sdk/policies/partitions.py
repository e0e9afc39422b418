"""Several partitions in one tier: a policy per partition under its quota, all under the capacity.

The shape the tenants' quotas take (module docstring of :mod:`.base`): a
:class:`Partitioned` is itself a :class:`~kvtier.policies.Policy`, so a tier
holds it as it holds any other.  Each key belongs to one partition for its
life (``partition_of(key)``: a tenant's keys are namespaced); each partition
runs its own policy of the chosen ``eviction``, whose capacity is the
partition's quota (the tier's capacity where none is set), so a partition
that fills its quota evicts its own blocks in its policy's order and never
another partition's.  When the partitions together exceed the tier's
capacity, the victim of :meth:`TenantRules.victim <kvtier.policies.tenancy.TenantRules.victim>`
(the partition most beyond its share: its quota, or its weight's part of
what quotas leave) gives up its next victims.  A put that could only fit by
taking a block of a partition within its share is refused
(:meth:`Partitioned.place`).  ``used_by(p)`` is a partition's bytes;
``stats()`` adds each partition's as ``partition_used_<p>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

from .base import Policy
from .registry import new_policy
from .tenancy import TenantRule, TenantRules

__all__ = ["Partitioned"]


class Partitioned:
    """Partitions of one capacity, each with its own ``eviction`` policy bounded by its quota.

    A caller admits a key of at most :meth:`limit` bytes (its partition's quota), as
    any policy's caller admits at most its capacity.
    """

    name: ClassVar[str] = "partitioned"

    def __init__(self, eviction: str, capacity: int, partition_of: Callable[[bytes], str],
                 quotas: Mapping[str, int] | None = None,
                 rules: TenantRules | None = None) -> None:
        self.eviction = eviction
        self.capacity = capacity
        self.evictions = 0
        self._partition_of = partition_of
        #: Each partition's quota and weight (``quotas`` alone: those quotas, equal weights).
        self.rules = rules if rules is not None else TenantRules(
            {p: TenantRule(quota=q) for p, q in (quotas or {}).items()})
        self._parts: dict[str, Policy] = {}

    def limit(self, key: bytes) -> int:
        """The largest block ``key``'s partition can hold: its quota."""
        return self.limit_of(self._partition_of(key))

    def limit_of(self, partition: str) -> int:
        quota = self.rules.quota(partition)
        return self.capacity if quota is None else min(quota, self.capacity)

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
        """As every policy's: ``key`` fits, from the partition most beyond its share
        where no partition is beyond it (:meth:`place` refuses then)."""
        return self.place(key, size, refuse=False)[0]

    def place(self, key: bytes, size: int, *, refuse: bool = True) -> tuple[list[bytes], bool]:
        """Admit ``key`` unless it could only fit by taking a block of a partition within
        its share (``refuse``): the keys evicted meanwhile, and whether ``key`` is held."""
        part = self._own(key)
        if size > part.capacity:
            raise ValueError(f"a block of {size} bytes over its partition's quota "
                             f"({part.capacity})")
        # room in the partition's quota first, from its own blocks; then in the tier,
        # from the partition most beyond its share (this one, maybe); then the admit,
        # which finds the room made
        victims = part.make_room(part.used + size - part.capacity)
        placed = True
        while self.used + size > self.capacity:
            victim = self._victim(self._partition_of(key), size)
            if victim is None and refuse:
                placed = False
                break
            victims += (victim or self._largest()).make_room(1)
        if placed:
            victims += part.admit(key, size)
        self.evictions += len(victims)
        return victims, placed

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

    def partitions(self) -> list[str]:
        """The partitions that hold a key, or held one."""
        return list(self._parts)

    def stats(self) -> dict[str, int]:
        return {f"partition_used_{name}": part.used for name, part in self._parts.items()}

    def _own(self, key: bytes) -> Policy:
        """``key``'s partition, made on its first key."""
        partition = self._partition_of(key)
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = new_policy(self.eviction, self.limit_of(partition))
        return part

    def _held(self) -> dict[str, int]:
        return {name: part.used for name, part in self._parts.items()}

    def _victim(self, writer: str, size: int) -> Policy | None:
        """The partition that gives up a block so that ``writer`` can put ``size`` bytes
        (:meth:`TenantRules.giver`); None: none can without going below its share."""
        name = self.rules.giver(self._held(), self.capacity, writer, size)
        return None if name is None else self._parts[name]

    def _largest(self) -> Policy:
        """The partition holding the most bytes beyond its share of the capacity."""
        held = {name: n for name, n in self._held().items() if n}
        shares = self.rules.shares(held, self.capacity)
        return self._parts[max(sorted(held), key=lambda name: held[name] - shares[name])]
