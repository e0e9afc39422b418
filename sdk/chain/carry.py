"""Deadlines that move with their blocks: a copy between tiers takes its deadline along.

A deadline (:meth:`Chain.expire <kvtier.chain.Chain.expire>`) is set at the
tiers that hold the block when it is given.  The traffic copies blocks later:
a promotion (a hit below, copied up), a demotion (a capacity victim, copied
down) and a write-through.  Each copy learns the deadline its block has and,
once it has landed, gets it where it landed (``kvtier_expire``, with the
seconds left then), so no copy outlives the deadline.  A copy whose deadline
passed before it landed is evicted there at once: a miss, as at the tier it
came from.

Where a deadline is learned:

- :class:`DeadlineRecord`, the deadlines this chain set, until they pass.  A
  demotion's block has left the tier it came from before its copy is
  written, so the chain's own record is the only place that still knows;
  every copy consults it when it is queued (a dictionary look-up, none while
  the record is empty).
- the tier a promotion or a write-through comes from, asked with
  ``kvtier_deadlines`` (contract 1.4) before the copy is written, on the
  writer's thread: for deadlines other processes set there (the ``fs`` pool's
  ``deadlines`` table, a shared store's).  Only a tier shared by processes
  is asked: a tier of this process alone holds the deadlines this chain set
  and recorded, so asking it would tell nothing new (unless the record has
  forgotten some, see :data:`RECORD_LIMIT`).

Both known, the earlier holds, as at any tier.  Keep marks do not move: a
kept block is no capacity victim, so it is never demoted, and a promotion's
source keeps its mark (docs/tenants.md, "Keep").

A deadline belongs to the block as stored: a block stored again after it
left has none, while a put of a key still stored is no change to it (the
copy the put stores gets the deadline too, in the traffic's settle).  So
the record forgets a key when its block leaves, as far as the chain can
tell: at a caller's evict (every tier evicts it), and at a put
(:meth:`DeadlineRecord.stored_again`, before the put stores) where the
deadline has passed (every tier that held the block expired it) or where
no tier holds the block nor is a copy on its way to one
(:func:`held_anywhere`).  Only a key with a deadline still ahead costs a
look-up at the tiers, only while the record knows one: a chain that sets
no deadlines puts with no more than a check that the record is empty.  A
tier that cannot answer may hold the block, so it keeps its deadline.  Not
found out: a block that left without this chain's evict (a tier's own
expiry, another process's evict) and that another process stored again in
a shared tier; its copies here take the recorded deadline until it passes.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence

from kvtier.chain.queue import Queued
from kvtier.chain.tier import Tier

__all__ = ["RECORD_LIMIT", "DeadlineRecord", "Times", "asks", "carry", "held_anywhere", "learn"]

#: Deadlines the chain remembers at most; beyond it the soonest are forgotten,
#: and from then on tiers of this process alone are asked too.
RECORD_LIMIT = 1 << 17
#: How long a deadline is remembered after it passed: a copy queued before it
#: and landing after it is still found out (and evicted where it lands).
_GRACE_S = 60.0
#: Deadlines this close go to a tier in one call, at the earliest of them.
_GROUP_S = 0.01

#: Per key, a deadline on the monotonic clock, or None.
Times = list[float | None]


class DeadlineRecord:
    """The deadlines this chain set: key -> monotonic time, bounded, pruned once past."""

    def __init__(self, limit: int = RECORD_LIMIT) -> None:
        self._at: dict[bytes, float] = {}
        self._soonest: list[tuple[float, bytes]] = []  # heap; stale entries skipped
        self._lock = threading.Lock()
        self._limit = limit
        self.forgot = False  # some deadline was dropped before it passed

    def __len__(self) -> int:
        return len(self._at)

    def remember(self, keys: Sequence[bytes], at: float) -> None:
        """``keys`` expire at ``at`` at the latest (an earlier deadline of a key stays)."""
        with self._lock:
            self._prune(time.monotonic() - _GRACE_S)
            for key in keys:
                known = self._at.get(key)
                if known is None or at < known:
                    self._at[key] = at
                    heapq.heappush(self._soonest, (at, key))
            while len(self._at) > self._limit:  # the soonest go: the least time left
                at_, key = heapq.heappop(self._soonest)
                if self._at.get(key) == at_:
                    del self._at[key]
                    self.forgot = True
            if len(self._soonest) > 2 * len(self._at) + 64:  # mostly stale: rebuilt
                self._soonest = [(a, k) for k, a in self._at.items()]
                heapq.heapify(self._soonest)

    def forget(self, keys: Sequence[bytes], at: float) -> None:
        """Forget ``keys``' deadline where it is ``at`` (one set for blocks held nowhere)."""
        with self._lock:
            for key in keys:
                if self._at.get(key) == at:
                    del self._at[key]

    def drop(self, keys: Sequence[bytes]) -> None:
        """Forget ``keys``' deadlines: their blocks left every tier (a caller's evict)."""
        if not self._at:
            return
        with self._lock:
            for key in keys:
                self._at.pop(key, None)

    def stored_again(
        self, keys: Sequence[bytes], held: Callable[[list[bytes]], Sequence[bool]]
    ) -> None:
        """Before a put of ``keys``: forget the deadlines of those whose block is gone.

        Gone where its deadline has passed, or where ``held`` (asked about
        the keys whose deadline is still ahead) says no tier holds it: the
        put stores a new block, which has none.  A key still held keeps
        its deadline, as the put is no change to its block.
        """
        if not self._at:  # the common case: no deadline in this process
            return
        now = time.monotonic()
        ahead: list[tuple[bytes, float]] = []
        with self._lock:
            for key in keys:
                at = self._at.get(key)
                if at is not None and at <= now:
                    del self._at[key]  # its heap entry goes stale: skipped
                elif at is not None:
                    ahead.append((key, at))
        if not ahead:
            return
        flags = held([key for key, _ in ahead])  # outside the lock: it asks the tiers
        with self._lock:
            for (key, at), flag in zip(ahead, flags, strict=True):
                if not flag and self._at.get(key) == at:  # unless set again meanwhile
                    del self._at[key]

    def known(self, keys: Sequence[bytes]) -> Times | None:
        """``keys``' deadlines (past ones too, for a while); None where none is known."""
        if not self._at:  # the common case: no deadline in this process
            return None
        with self._lock:
            self._prune(time.monotonic() - _GRACE_S)
            found = [self._at.get(k) for k in keys]
        return found if any(a is not None for a in found) else None

    def _prune(self, before: float) -> None:
        soonest, at = self._soonest, self._at
        while soonest and soonest[0][0] < before:
            when, key = heapq.heappop(soonest)
            if at.get(key) == when:
                del at[key]


def held_anywhere(tiers: Sequence[Tier], queued: Queued, keys: list[bytes]) -> list[bool]:
    """Per key, whether some tier holds its block or a copy is on its way to one; True
    where a tier that cannot answer (failed, backed off) was left to ask."""
    on_the_way = queued.snapshot(keys)
    out = [key in on_the_way for key in keys]
    for tier in tiers:
        ask = [i for i, flag in enumerate(out) if not flag]
        if not ask:
            break
        answer = _lookup(tier, [keys[i] for i in ask])
        for i, flag in zip(ask, answer or [True] * len(ask), strict=True):
            out[i] = bool(flag)
    return out


def _lookup(tier: Tier, keys: list[bytes]) -> Sequence[bool] | None:
    return tier._call("lookup", lambda: tier.handle.lookup(keys), len(keys))


def asks(record: DeadlineRecord, source: Tier) -> bool:
    """Whether a copy from ``source`` asks it for deadlines (module docstring)."""
    return (source.capabilities.shared or record.forgot) \
        and source.handle.implements("kvtier_deadlines")


def learn(source: Tier, keys: Sequence[bytes], known: Times | None) -> Times | None:
    """``known`` joined with what ``source`` answers for ``keys`` (``kvtier_deadlines``),
    the earlier where both; None where neither knows any."""
    answer = source._call("deadlines", lambda: source.handle.deadlines(keys), len(keys))
    if answer is None or not any(left is not None for left in answer):
        return known
    now = time.monotonic()
    out: Times = list(known) if known is not None else [None] * len(keys)
    for j, left in enumerate(answer):
        if left is not None:
            mine = out[j]
            out[j] = now + left if mine is None else min(mine, now + left)
    return out


def carry(tier: Tier, keys: Sequence[bytes], flags: Sequence[bool], at: Times) -> list[bool]:
    """After copies of ``keys`` landed at ``tier`` (``flags``: stored), give each its
    deadline ``at`` there; a copy past its deadline is evicted, False in the flags
    returned.  A tier without ``kvtier_expire`` keeps the others by its own ``expire``."""
    groups: dict[float, list[int]] = {}
    for j, (stored, when) in enumerate(zip(flags, at, strict=True)):
        if stored and when is not None:
            groups.setdefault(when - when % _GROUP_S, []).append(j)  # earlier, never later
    if not groups:
        return list(flags)
    now = time.monotonic()
    past = [j for group, part in groups.items() if group <= now for j in part]
    if tier.handle.implements("kvtier_expire"):
        for group, part in groups.items():
            if group > now:
                _expire(tier, [keys[j] for j in part], group - now)
    out = list(flags)
    if past:
        tier.evict([keys[j] for j in past])
        for j in past:
            out[j] = False
    return out


def _expire(tier: Tier, keys: list[bytes], after: float) -> None:
    tier._call("expire", lambda: tier.handle.expire(keys, after), len(keys))
