"""What every eviction policy offers (:class:`Policy`), and the byte accounting they share.

A policy is a tier's bookkeeping of *which* keys it holds and *which* leave
first; it never sees a block's bytes.  The tier keeps its payloads itself
(a dict, files, objects) and calls the policy with keys and sizes, under the
tier's own lock: a policy is not thread-safe, and callers serialise calls.

Keys are ``bytes`` (``kvtier plan`` replays ``int`` keys: any hashable key
works, and :mod:`.adaptive` hashes both).  Sizes are bytes; a caller that
counts blocks of one size passes 1 (vLLM's CPU tier).

Partitions (per-tenant quotas and retention inside one tier) compose rather
than widen this protocol: :class:`~kvtier.policies.Partitioned` is itself a
:class:`Policy` that holds one policy per partition (each with the
partition's quota as its capacity) and a map from key to partition.  Its
``admit`` lets the key's own partition evict first (its quota), then, while
the whole tier is over its capacity, takes victims from the partition most
beyond its share; its ``used`` is the sum, and it adds ``used_by(partition)``
and ``limit(key)``.  So every method here stays about keys and sizes, a key
belongs to one partition for its life (a tenant's keys are namespaced), and
the eviction order inside a partition is the chosen policy's own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar, Protocol, runtime_checkable

__all__ = ["Accounting", "Ghosts", "Policy"]


@runtime_checkable
class Policy(Protocol):
    """The calls a tier makes on its eviction policy: keys and sizes, no payloads.

    Uses and lookups:

    * ``holds(keys)``: which of ``keys`` are held; *not* a use (the chain
      probes tiers with it).  :mod:`.adaptive` takes it as the start of a
      request.
    * ``size(key)``: the size held for ``key``, or None; not a use.
    * ``access(key)``: a use of ``key`` (a get that found it, a put of a key
      held); True if held, False (and nothing changes) if not.

    Entering and leaving:

    * ``admit(key, size)``: hold ``key``, which is not held, of ``size`` <=
      ``capacity`` bytes, evicting first until it fits.  Returns the keys
      evicted, first evicted first; they are no longer held, and each adds
      one to ``evictions``.
    * ``enter(key, size)``: hold ``key``, not held, *without* making room: a
      block known stored (found on disk, listed in a bucket) or one the caller
      made room for.  ``used`` may exceed ``capacity`` until ``shed`` or the
      next ``admit``.
    * ``remove(key)``: forget ``key`` at the caller's request (an explicit
      evict, a block gone otherwise); no ghost, not an eviction.  True if it
      was held.
    * ``resize(key, size)``: ``key``, held, now weighs ``size`` bytes; its
      place is kept.
    * ``shed()``: evict until ``used <= capacity`` again; the keys evicted.
    * ``make_room(nbytes)``: evict, in the policy's order, until ``used`` is
      ``nbytes`` lower (or 0), whatever the capacity; the keys evicted.  A
      cache that owns its capacity (vLLM's CPU tier) asks for its victims
      this way, then admits.

    Figures: ``capacity``, ``used`` (bytes held), ``evictions`` (keys the
    policy chose to drop, never those removed by ``remove``), ``len()`` (keys
    held), ``held()`` (key and size of every key held, the first to leave
    roughly first: the order a successor policy takes them in), and
    ``stats()`` (the policy's own figures for a tier's stats, e.g.
    ``arc_p``).
    """

    #: The policy's name in the registry (a tier's ``eviction`` option).
    name: ClassVar[str]

    @property
    def capacity(self) -> int: ...

    @property
    def used(self) -> int: ...

    @property
    def evictions(self) -> int: ...

    def __len__(self) -> int: ...

    def holds(self, keys: Sequence[bytes]) -> list[bool]: ...

    def size(self, key: bytes) -> int | None: ...

    def access(self, key: bytes) -> bool: ...

    def admit(self, key: bytes, size: int) -> list[bytes]: ...

    def enter(self, key: bytes, size: int) -> None: ...

    def remove(self, key: bytes) -> bool: ...

    def resize(self, key: bytes, size: int) -> None: ...

    def shed(self) -> list[bytes]: ...

    def make_room(self, nbytes: int) -> list[bytes]: ...

    def held(self) -> list[tuple[bytes, int]]: ...

    def stats(self) -> dict[str, int]: ...


class Accounting:
    """Byte accounting shared by the fixed policies: ``admit``, ``shed`` and
    ``make_room`` on top of a subclass's ``enter`` and ``_evict_one``.

    ``_evict_one`` makes one step of the policy's eviction: it evicts a key
    and returns it, or only moves one (S3-FIFO's reinsertions) and returns
    None.  ``_trim`` trims ghost lists after a ``shed``.
    """

    name: ClassVar[str]

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.evictions = 0

    def stats(self) -> dict[str, int]:
        return {}

    def enter(self, key: bytes, size: int) -> None:
        raise NotImplementedError

    def admit(self, key: bytes, size: int) -> list[bytes]:
        if self.used + size <= self.capacity:  # the common case: no room to make
            self.enter(key, size)
            return []
        victims = self._evict_until(self.capacity - size)
        self.enter(key, size)
        return victims

    def shed(self) -> list[bytes]:
        victims = self._evict_until(self.capacity)
        self._trim()
        return victims

    def make_room(self, nbytes: int) -> list[bytes]:
        return self._evict_until(max(0, self.used - nbytes))

    def _evict_until(self, budget: int) -> list[bytes]:
        victims: list[bytes] = []
        while self.used > budget:
            key = self._evict_one()
            if key is not None:
                victims.append(key)
        self.evictions += len(victims)
        return victims

    def _evict_one(self) -> bytes | None:
        raise NotImplementedError

    def _trim(self) -> None:
        """Trim the ghost lists (none here)."""


class Ghosts:
    """Keys and byte weights of blocks evicted from one queue, oldest first."""

    __slots__ = ("bytes", "keys")

    def __init__(self) -> None:
        self.keys: OrderedDict[bytes, int] = OrderedDict()
        self.bytes = 0

    def add(self, key: bytes, size: int) -> None:
        weight = max(size, 1)  # so that empty blocks cannot grow the list without bound
        self.keys[key] = weight
        self.bytes += weight

    def discard(self, key: bytes) -> None:
        self.bytes -= self.keys.pop(key, 0)

    def drop_oldest(self) -> None:
        self.bytes -= self.keys.popitem(last=False)[1]
