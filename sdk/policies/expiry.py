"""When each block of a tier expires: the clock a tier keeps for its ``expire`` setting.

:class:`ExpiryClock` follows an :class:`~kvtier.policies.tenancy.Expiry`:
``after`` seconds from a block's write, or ``unused`` seconds after its last
use (a get that found it, a put of a key held).  It keeps the keys in write
order and in use order, so that :meth:`ExpiryClock.due` finds every expired
key from the front of those orders, never by a walk of every key: a tier
can sweep on every put.  Times are the caller's, on one monotonic clock
(``time.monotonic()`` in a process; a file's mtime is another clock).  Like
a policy, it is not thread-safe: the tier's lock guards it.

A key may also have a **deadline** of its own (:meth:`ExpiryClock.deadline`,
``kvtier_expire``): it expires then, or when ``after`` or ``unused`` say,
whichever comes first.  Deadlines are kept in a heap, so :meth:`~ExpiryClock.due`
finds them from the soonest too; a clock of an :class:`Expiry` that is none
(no ``after``, no ``unused``) holds deadlines alone.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

from .tenancy import Expiry

__all__ = ["ExpiryClock"]

K = TypeVar("K", bound=Hashable)


class ExpiryClock(Generic[K]):
    """Each key's write and last use, oldest first, by an :class:`Expiry`."""

    def __init__(self, expiry: Expiry) -> None:
        self.after, self.unused = expiry.after, expiry.unused
        self._written: OrderedDict[K, float] = OrderedDict()  # with after
        self._used: OrderedDict[K, float] = OrderedDict()  # with unused
        self._deadlines: dict[K, float] = {}  # a key's own, sooner than the rest
        self._soonest: list[tuple[float, int, K]] = []  # heap; stale entries skipped
        self._pushed = 0  # ties broken by order: keys need not compare

    def __len__(self) -> int:
        return len(self._written or self._used or self._deadlines)

    def __contains__(self, key: object) -> bool:
        return key in self._written or key in self._used or key in self._deadlines

    def deadline(self, key: K, at: float) -> None:
        """``key`` expires at ``at`` at the latest (an earlier deadline of it stays)."""
        known = self._deadlines.get(key)
        if known is not None and known <= at:
            return
        self._deadlines[key] = at
        self._pushed += 1
        heapq.heappush(self._soonest, (at, self._pushed, key))

    def deadline_of(self, key: K) -> float | None:
        """``key``'s own deadline (:meth:`deadline`), None where it has none; past or not."""
        return self._deadlines.get(key)

    def left(self, key: K, now: float) -> float | None:
        """Seconds from ``now`` to ``key``'s own deadline (``kvtier_deadlines``); None where
        it has none or its block has expired (by it, or by ``after``/``unused``)."""
        at = self._deadlines.get(key)
        return None if at is None or self.expired(key, now) else at - now

    def soonest(self) -> float | None:
        """The earliest deadline of a key still known; None: none."""
        soonest, deadlines = self._soonest, self._deadlines
        while soonest and deadlines.get(soonest[0][2]) != soonest[0][0]:
            heapq.heappop(soonest)  # stale: moved sooner, or forgotten
        return soonest[0][0] if soonest else None

    def wrote(self, key: K, now: float) -> None:
        """``key`` was stored at ``now`` (a new block: it is a use too)."""
        if self.after is not None:
            self._written[key] = now
            self._written.move_to_end(key)
        self.used(key, now)

    def used(self, key: K, now: float) -> None:
        """``key`` was used at ``now``."""
        if self.unused is not None:
            self._used[key] = now
            self._used.move_to_end(key)

    def expired(self, key: K, now: float) -> bool:
        """Whether ``key``'s block has expired at ``now`` (a key not known has not)."""
        written = self._written.get(key)
        if written is not None and self.after is not None and now - written >= self.after:
            return True
        used = self._used.get(key)
        if used is not None and self.unused is not None and now - used >= self.unused:
            return True
        deadline = self._deadlines.get(key)
        return deadline is not None and now >= deadline

    def forget(self, key: K) -> None:
        """``key`` left the tier otherwise (evicted, removed): its deadline goes too."""
        self._written.pop(key, None)
        self._used.pop(key, None)
        if self._deadlines.pop(key, None) is not None and not self._deadlines:
            self._soonest.clear()  # every entry is stale

    def due(self, now: float) -> list[K]:
        """The keys expired at ``now``, forgotten: the oldest writes and uses only."""
        out: list[K] = []
        for order, limit in ((self._written, self.after), (self._used, self.unused)):
            while order and limit is not None:
                key, since = next(iter(order.items()))
                if now - since < limit:
                    break
                self.forget(key)
                out.append(key)
        soonest, deadlines = self._soonest, self._deadlines
        while soonest and soonest[0][0] <= now:
            at, _, key = heapq.heappop(soonest)
            if deadlines.get(key) == at:  # else stale: moved sooner, or forgotten
                self.forget(key)
                out.append(key)
        return out
