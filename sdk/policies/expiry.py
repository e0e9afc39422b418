"""When each block of a tier expires: the clock a tier keeps for its ``expire`` setting.

:class:`ExpiryClock` follows an :class:`~kvtier.policies.tenancy.Expiry`:
``after`` seconds from a block's write, or ``unused`` seconds after its last
use (a get that found it, a put of a key held).  It keeps the keys in write
order and in use order, so that :meth:`ExpiryClock.due` finds every expired
key from the front of those orders, never by a walk of every key: a tier
can sweep on every put.  Times are the caller's, on one monotonic clock
(``time.monotonic()`` in a process; a file's mtime is another clock).  Like
a policy, it is not thread-safe: the tier's lock guards it.
"""

from __future__ import annotations

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

    def __len__(self) -> int:
        return len(self._written or self._used)

    def __contains__(self, key: object) -> bool:
        return key in self._written or key in self._used

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
        return used is not None and self.unused is not None and now - used >= self.unused

    def forget(self, key: K) -> None:
        """``key`` left the tier otherwise (evicted, removed)."""
        self._written.pop(key, None)
        self._used.pop(key, None)

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
        return out
