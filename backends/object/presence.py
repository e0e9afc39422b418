"""What an ``object`` instance knows is stored, so that a hit's lookup sends no request.

A lookup of a 64-block prefix used to send 64 HEADs: 12-25 ms against a
SeaweedFS on the same machine, whatever the threads (the server answers
about 4700 HEADs a second).  A LIST of the namespace answers a thousand
keys a request, but block keys are hashes spread over the namespace, so no
LIST answers one prefix.  :class:`Presence` adds to the short-lived
presence cache (:class:`.keys.PresenceCache`, ``lookup_cache_ttl``) the
keys this instance stored, read, found by a HEAD or listed (a LIST at open,
and the capacity's passes), each answered present for ``lookup_index``
seconds after it was learned without a request.

The bucket stays the authority: a key another writer deleted since is
answered present until a get finds it missing, and that get is a miss (it
reads nothing into the caller's buffers and is checked as every read is),
which drops the key.  A key whose last-modified time is unknown (a HEAD or
a conditional put that found it already stored) is learned only where
nothing expires; one past ``expire`` is never answered present.  A LIST
that saw the whole namespace drops the keys learned before it began that
it did not list; a key dropped while a LIST ran is not learned from it.
At most :data:`KNOWN_MAX` keys are held, the least recently learned leave.

None is thread-safe: the backend's lock guards every call.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from .keys import PresenceCache

__all__ = ["KNOWN_MAX", "Presence"]

#: Keys learned before the least recently learned leave (a 2 MiB block each:
#: 128 GiB of a namespace), and the most a LIST at open learns.
KNOWN_MAX = 1 << 16


class Presence(PresenceCache):
    """The presence cache, and the keys known stored (``lifetime`` <= 0: none)."""

    def __init__(self, ttl: float, lifetime: float = 0.0) -> None:
        super().__init__(ttl)
        self.lifetime = lifetime
        self.max_age: float | None = None  # the instance's expire, seconds after a write
        # key -> (last-modified epoch, learned at on the monotonic clock)
        self._known: dict[bytes, tuple[float, float]] = {}
        self._listing = 0  # LISTs running: the keys dropped meanwhile are noted
        self._dropped: dict[bytes, float] = {}

    @property
    def known(self) -> int:
        """How many keys are held as known stored."""
        return len(self._known)

    def get(self, key: bytes, now: float) -> bool | None:
        cached = super().get(key, now)
        if cached is not None:
            return cached
        entry = self._known.get(key)
        if entry is None:
            return None
        if now - entry[1] >= self.lifetime or self._expired(entry[0]):
            del self._known[key]
            return None
        return True

    def remember(self, key: bytes, present: bool, mtime: float | None = None) -> None:
        """``present`` as the short-lived answer; a key present is learned with
        ``mtime`` (its last-modified epoch; None: unknown, learned only where
        nothing expires), a key absent is dropped."""
        super().remember(key, present)
        if not present:
            self._drop_known(key)
        elif mtime is not None or self.max_age is None:
            self._learn(key, time.time() if mtime is None else mtime, time.monotonic())

    def drop(self, key: bytes) -> None:
        super().drop(key)
        self._drop_known(key)

    def clear(self) -> None:
        super().clear()
        self._known.clear()
        self._dropped.clear()

    def listing_started(self) -> float:
        """A LIST begins: its start on the monotonic clock, for :meth:`listed`."""
        self._listing += 1
        return time.monotonic()

    def listed(self, found: Iterable[tuple[bytes, float]], started: float,
               *, whole: bool) -> None:
        """What a LIST begun at ``started`` found, (key, last-modified epoch) each;
        ``whole``: it saw the whole namespace, so keys learned before it began
        and not found are gone."""
        self._listing -= 1
        if self.lifetime <= 0:
            self._dropped.clear()
            return
        dropped = {k for k, at in self._dropped.items() if at >= started}
        if self._listing == 0:
            self._dropped.clear()
        seen = set()
        for key, mtime in found:
            seen.add(key)
            if key not in dropped and key not in self._known:
                self._learn(key, mtime, started)
        if whole:
            for key in [k for k, e in self._known.items() if e[1] < started and k not in seen]:
                del self._known[key]

    def _learn(self, key: bytes, mtime: float, at: float) -> None:
        if self.lifetime <= 0 or self._expired(mtime):
            return
        self._known.pop(key, None)  # to the end: the most recently learned
        if len(self._known) >= KNOWN_MAX:
            del self._known[next(iter(self._known))]
        self._known[key] = (mtime, at)

    def _drop_known(self, key: bytes) -> None:
        self._known.pop(key, None)
        if self._listing:
            self._dropped[key] = time.monotonic()

    def _expired(self, mtime: float) -> bool:
        return self.max_age is not None and time.time() - mtime >= self.max_age
