"""The blocks of one host capacity: one tier instance's, or those of a group sharing it.

A :class:`HostStore` holds blocks, their eviction policy, their expiry clock
and the figures of each tenant, under one lock.  A tier instance opened
alone has a store of its own and names its blocks by their keys.  Instances
that share a capacity (the tenants of one process: :mod:`.shared`) share a
store, and each names its blocks by a prefix of 16 bytes, a digest of its
namespace, before the key: two namespaces never name one block, and the
prefix says whose tenant a block is.

**Quotas and fair share.**  With ``tenants`` rules, or shared, the policy is
a :class:`~kvtier.policies.Partitioned` with a partition per tenant: a put
beyond the tenant's quota evicts the tenant's own blocks first; a full store
evicts from the tenant :meth:`~kvtier.policies.tenancy.TenantRules.victim`
names (the most beyond its share); a block larger than the tenant's quota,
or one that would take room only tenants within their share hold, is
refused and counted.

**Victims of other instances.**  A put hands its own victims to its caller
(``evicted``), who may save them below.  A block of another namespace,
evicted for this put, is kept aside for the instances of its own namespace:
their next put hands it over, and their gets still find it until then (at
most ``capacity`` bytes kept aside; the oldest go first beyond that).

**Expiry.**  With ``expire``, an expired block is a miss: a get or lookup
that finds it drops it, and every put and get sweeps the blocks due
(:class:`~kvtier.policies.expiry.ExpiryClock`, which finds them without a
walk).  An expired block is not handed over as a victim: it is gone.  A
block given a deadline of its own (:meth:`HostStore.expire`,
``kvtier_expire``) expires then, or by ``expire``, whichever comes first;
without ``expire``, the first deadline starts the clock.

**Keep.**  A block marked kept (:meth:`HostStore.keep`) is no victim while
marked, within its tenant's retention budget (:mod:`.kept`); it still
expires.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvtier.policies import Partitioned, Policy, new_policy
from kvtier.policies.expiry import ExpiryClock
from kvtier.policies.sizing import Sizer
from kvtier.policies.tenancy import Expiry, TenantRules
from kvtier.spec.base import Evicted

from .kept import KeptMarks, spare

__all__ = ["PREFIX", "HostStore", "Settings", "prefix_of"]

_B = TypeVar("_B")
#: Bytes of the prefix naming a namespace's blocks in a shared store.
PREFIX = 16
#: The per-tenant figures of ``stats()``, each ``<name>.<tenant>``.
_TENANT_COUNTS = ("tenant_refused", "tenant_evicted", "tenant_expired")


def prefix_of(namespace: str) -> bytes:
    """The prefix of ``namespace``'s blocks in a shared store."""
    return hashlib.blake2b(namespace.encode(), digest_size=PREFIX).digest()


@dataclass(frozen=True)
class Settings:
    """What a store is: instances sharing one must agree on all of it."""

    capacity: int
    eviction: str
    max_block_size: int | None
    rules: TenantRules
    expiry: Expiry
    sizing_sample: float

    def describe(self) -> str:
        return (f"capacity {self.capacity}, eviction {self.eviction}, max_block_size "
                f"{self.max_block_size}, tenants {self.rules.canonical()}, expire "
                f"{self.expiry}, sizing_sample {self.sizing_sample}")


class HostStore:
    """Blocks under one capacity; every method takes the caller's prefix (b"" alone)."""

    def __init__(self, settings: Settings, *, shared: bool, tenant: str) -> None:
        self.settings = settings
        self.shared = shared
        self.lock = threading.Lock()
        self.blocks: dict[bytes, bytes] = {}
        capacity = settings.capacity
        self._tenant_of_prefix: dict[bytes, str] = {}
        self.policy: Policy
        if shared:
            self.policy = Partitioned(settings.eviction, capacity, self._partition_of,
                                      rules=settings.rules)
        elif settings.rules:
            self.policy = Partitioned(settings.eviction, capacity, lambda _: tenant,
                                      rules=settings.rules)
        else:
            self.policy = new_policy(settings.eviction, capacity)
        self.clock: ExpiryClock[bytes] | None = ExpiryClock(settings.expiry) \
            if settings.expiry else None
        sample = settings.sizing_sample
        self.sizer = Sizer(settings.eviction, capacity, sample) if sample > 0 else None
        self.expired = 0
        self._counts: dict[str, Counter[str]] = {name: Counter() for name in _TENANT_COUNTS}
        self._owners: Counter[bytes] = Counter()  # open instances per prefix
        self._aside: dict[bytes, OrderedDict[bytes, bytes]] = {}  # victims owed, per prefix
        self._aside_bytes = 0
        self._private_tenant = tenant
        self.kept = KeptMarks(capacity)

    # instances --------------------------------------------------------------
    def attach(self, prefix: bytes, tenant: str) -> None:
        with self.lock:
            self._owners[prefix] += 1
            self._tenant_of_prefix[prefix] = tenant

    def detach(self, prefix: bytes) -> None:
        """An instance closed; the last of its namespace takes that namespace's blocks along."""
        with self.lock:
            self._owners[prefix] -= 1
            if self._owners[prefix] > 0:
                return
            del self._owners[prefix]
            for key in [k for k in self.blocks if k.startswith(prefix)]:
                self._drop(key)
            self._aside_bytes -= sum(map(len, self._aside.pop(prefix, {}).values()))

    def tenant(self, prefix: bytes) -> str:
        return self._tenant_of_prefix.get(prefix, self._private_tenant)

    def limit(self, tenant: str) -> int:
        """The largest block ``tenant`` may put: capacity, max_block_size, its quota."""
        s = self.settings
        limit = s.capacity if s.max_block_size is None else min(s.capacity, s.max_block_size)
        quota = s.rules.quota(tenant)
        return limit if quota is None else min(limit, quota)

    # data path (the caller holds no lock) -----------------------------------
    def put(self, prefix: bytes, keys: Sequence[bytes], blocks: Sequence[_B],
            sizes: Sequence[int], to_bytes: Callable[[_B], bytes], evicted: Evicted) -> list[bool]:
        stored: list[bool] = []
        tenant = self.tenant(prefix)
        refused = self._counts["tenant_refused"]
        with self.lock:
            now = self._sweep()
            self._hand_over(prefix, evicted)
            policy, held, clock, limit = self.policy, self.blocks, self.clock, self.limit(tenant)
            place = policy.place if isinstance(policy, Partitioned) else None
            for key, block, size in zip(keys, blocks, sizes, strict=True):
                full = prefix + key
                if clock is not None and full in held and clock.expired(full, now):
                    self._expire(full)
                if policy.access(full):
                    if clock is not None:
                        clock.used(full, now)
                    stored.append(True)  # immutable per key: keep what is there
                    continue
                if size > limit:
                    refused[tenant] += 1
                    stored.append(False)
                    continue
                victims, placed = (place(full, size) if place is not None
                                   else (policy.admit(full, size), True))
                if self.kept.sizes:  # kept blocks are no victims (.kept)
                    victims, placed = self._spare(full, victims, placed)
                if victims:
                    self._evicted(prefix, victims, evicted)
                if not placed:
                    refused[tenant] += 1
                    stored.append(False)
                    continue
                # Copied under the lock so a key already stored costs no copy;
                # the GIL would serialise the memcpy anyway.
                held[full] = to_bytes(block)
                if clock is not None:
                    clock.wrote(full, now)
                stored.append(True)
            if self.sizer is not None:
                self.sizer.stored([prefix + k for k in keys] if prefix else keys, sizes, limit)
        return stored

    def get(self, prefix: bytes, keys: Sequence[bytes]) -> list[bytes | None]:
        with self.lock:
            now = self._sweep()
            access, held, clock = self.policy.access, self.blocks, self.clock
            full = [prefix + k for k in keys] if prefix else keys
            if self.sizer is not None:
                self.sizer.got(full)
            found: list[bytes | None] = []
            for key in full:
                if clock is not None and key in held and clock.expired(key, now):
                    self._expire(key)
                if access(key):
                    if clock is not None:
                        clock.used(key, now)
                    found.append(held[key])
                else:
                    found.append(None)
            aside = self._aside.get(prefix)
            if aside:  # victims on their way to this namespace's next put
                found = [aside.get(k) if f is None else f for k, f in zip(keys, found)]
            return found

    def lookup(self, prefix: bytes, keys: Sequence[bytes]) -> list[bool]:
        with self.lock:
            full = [prefix + k for k in keys] if prefix else list(keys)
            clock = self.clock
            if clock is not None:
                now = time.monotonic()
                for key in full:
                    if key in self.blocks and clock.expired(key, now):
                        self._expire(key)
            return self.policy.holds(full)

    def evict(self, prefix: bytes, keys: Sequence[bytes]) -> list[bool]:
        with self.lock:
            removed = []
            for key in keys:
                full = prefix + key
                gone = self.policy.remove(full)
                if gone:
                    del self.blocks[full]
                    self.kept.forget(full)
                    if self.clock is not None:
                        self.clock.forget(full)
                removed.append(gone)
            return removed

    def tamper(self, prefix: bytes, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        with self.lock:
            full = prefix + key
            old = self.blocks.get(full)
            if old is None:
                return False
            # Recency is left alone, but the byte count follows the new length
            # so the capacity still holds; a grown block may push others out,
            # and they are dropped unreported as there is no caller to take them.
            new = bytes(transform(old))
            self.blocks[full] = new
            self.policy.resize(full, len(new))
            for gone in self.policy.shed():
                self._drop(gone)
            return True

    def held(self, prefix: bytes) -> list[tuple[bytes, int]]:
        """Key and size of every block of ``prefix``'s namespace."""
        with self.lock:
            held = self.policy.held()
        if not prefix:
            return held
        n = len(prefix)
        return [(key[n:], size) for key, size in held if key[:n] == prefix]

    def stats(self, prefix: bytes) -> dict[str, int | float]:
        """The store's figures, and those of ``prefix``'s tenant as ``tenant_*.<tenant>``."""
        tenant = self.tenant(prefix)
        with self.lock:
            policy = self.policy
            out: dict[str, int | float] = {
                "used_bytes": policy.used,
                "blocks": len(policy),
                "capacity_bytes": policy.capacity,
                "evictions": policy.evictions - self.kept.spared,
                "kept_bytes": self.kept.by_tenant[tenant],
                "kept_blocks": len(self.kept),
                "keep_refused": self.kept.refused[tenant],
                "expired": self.expired,
                f"tenant_bytes.{tenant}": (policy.used_by(tenant)
                                           if isinstance(policy, Partitioned) else policy.used),
                **{f"{name}.{tenant}": self._counts[name][tenant] for name in _TENANT_COUNTS},
            }
            if not isinstance(policy, Partitioned):  # its partitions are the tenant_bytes
                out.update(policy.stats())
            if self.sizer is not None:
                out.update(self.sizer.stats())
            return out

    def keep(self, prefix: bytes, keys: Sequence[bytes], keep: bool) -> list[bool | None]:
        """Mark ``keys`` kept (``keep``) or release them, as ``kvtier_keep`` answers."""
        tenant = self.tenant(prefix)
        budget = min(self.settings.rules.rule(tenant).keep, self.limit(tenant))
        out: list[bool | None] = []
        with self.lock:
            now = self._sweep()
            for key in keys:
                full = prefix + key
                if self.clock is not None and full in self.blocks \
                        and self.clock.expired(full, now):
                    self._expire(full)  # expiry wins over keep
                size = self.policy.size(full)
                if size is None:
                    out.append(None)
                elif keep:
                    out.append(self.kept.mark(full, size, tenant, budget))
                else:
                    self.kept.forget(full)
                    out.append(True)
        return out

    def expire(self, prefix: bytes, keys: Sequence[bytes], after: float) -> list[bool | None]:
        """Give ``keys``' blocks a deadline ``after`` seconds from now, as
        ``kvtier_expire`` answers: True where held, None where not."""
        out: list[bool | None] = []
        with self.lock:
            if self.clock is None:  # no expire: the clock holds deadlines alone
                self.clock = ExpiryClock(Expiry())
            now = self._sweep()
            for key in keys:
                full = prefix + key
                if full in self.blocks and self.clock.expired(full, now):
                    self._expire(full)
                if self.policy.size(full) is None:
                    out.append(None)
                    continue
                self.clock.deadline(full, now + after)
                out.append(True)
        return out

    def deadlines(self, prefix: bytes, keys: Sequence[bytes]) -> list[float | None]:
        """Seconds left before ``keys``' own deadlines, as ``kvtier_deadlines`` answers:
        None where not held, with none, or expired (asking sweeps nothing, uses nothing)."""
        with self.lock:
            clock = self.clock
            if clock is None:  # no deadline was ever given here
                return [None] * len(keys)
            now = time.monotonic()
            fulls = [prefix + key for key in keys]
            return [clock.left(full, now) if full in self.blocks else None for full in fulls]

    # internals: the caller holds the lock ----------------------------------
    def _spare(self, full: bytes, victims: list[bytes], placed: bool) -> tuple[list[bytes], bool]:
        """``victims`` without the kept blocks; the put of ``full`` refused where only
        kept blocks could make its room (:func:`.kept.spare`)."""
        victims, placed = spare(self.policy, self.kept, victims,
                                lambda: self.policy.remove(full))
        if full in victims:  # the policy took the new block itself for the room
            victims.remove(full)
            placed = False
        return victims, placed
    def _partition_of(self, key: bytes) -> str:
        return self._tenant_of_prefix[key[:PREFIX]]

    def _tenant_of_key(self, key: bytes) -> str:
        return self._partition_of(key) if self.shared else self._private_tenant

    def _evicted(self, prefix: bytes, victims: list[bytes], evicted: Evicted) -> None:
        """Hand ``prefix``'s own victims over; keep the others' aside for their owners."""
        counts = self._counts["tenant_evicted"]
        n = len(prefix)
        for victim in victims:
            data = self.blocks.pop(victim)
            if self.clock is not None:
                self.clock.forget(victim)
            counts[self._tenant_of_key(victim)] += 1
            if victim[:n] == prefix:
                evicted.append((victim[n:], data))
                continue
            owner = victim[:PREFIX]
            self._aside.setdefault(owner, OrderedDict())[victim[PREFIX:]] = data
            self._aside_bytes += len(data)
            aside = self._aside[owner]
            while self._aside_bytes > self.settings.capacity and aside:
                self._aside_bytes -= len(aside.popitem(last=False)[1])

    def _hand_over(self, prefix: bytes, evicted: Evicted) -> None:
        aside = self._aside.pop(prefix, None)
        if aside:
            self._aside_bytes -= sum(map(len, aside.values()))
            evicted.extend(aside.items())

    def _sweep(self) -> float:
        """Drop the blocks due to expire; the time now (0 without expiry)."""
        if self.clock is None:
            return 0.0
        now = time.monotonic()
        for key in self.clock.due(now):
            self._expire(key, forgotten=True)
        return now

    def _expire(self, key: bytes, *, forgotten: bool = False) -> None:
        if self.policy.remove(key):
            del self.blocks[key]
            self.kept.forget(key)
            self.expired += 1
            self._counts["tenant_expired"][self._tenant_of_key(key)] += 1
        if not forgotten and self.clock is not None:
            self.clock.forget(key)

    def _drop(self, key: bytes) -> None:
        self.kept.forget(key)
        self.policy.remove(key)
        self.blocks.pop(key, None)
        if self.clock is not None:
            self.clock.forget(key)
