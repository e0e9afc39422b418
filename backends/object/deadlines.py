"""Deadlines on the ``object`` tier: ``kvtier_expire`` and ``kvtier_deadlines``, held by
the instance that set them.

S3 keeps no time but an object's last-modified one, which a deadline cannot
move: so a deadline lives in the instance that was given it, in an
:class:`~kvtier.policies.expiry.ExpiryClock` (a heap of deadlines, on this
process's monotonic clock).  From the first deadline on:

- a get, a scatter read and a lookup of this instance answer a miss for a
  block past its deadline (the bucket may still hold it for a moment);
- a thread of the instance deletes each block at its deadline, through the
  backend's own expiry (:meth:`ObjectBackend._expire`, which counts it in
  ``expired`` and forgets it in the index, the presence cache and the kept
  marks), so every other process misses it from then on.

``kvtier_deadlines`` answers this instance's deadlines, for blocks its lookup
still finds.  A deadline is lost if the instance closes first: the block then keeps the
tier's ``expire`` alone (docs/tenants.md, "Expiry").  A block stored again
under the key after its deadline has none: the deadline left with it.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

from kvtier.policies.expiry import ExpiryClock
from kvtier.policies.tenancy import Expiry
from kvtier.spec.base import Deadlines as DeadlinesLeft
from kvtier.spec.hookspecs import hookimpl

__all__ = ["Deadlines"]

log = logging.getLogger("kvtier.backends.object")

#: The longest the deleting thread sleeps before it looks whether its instance closed.
_WAKE_S = 1.0


class Deadlines(DeadlinesLeft):
    """Mixin of :class:`~kvtier.backends.object.ObjectBackend`: ``kvtier_expire`` and
    ``kvtier_deadlines`` (module docstring).  Not :class:`~kvtier.spec.base.Expire`: the
    backend's ``_expire`` is its deletion of expired objects."""

    _store: Any
    _deadline_times: _Clock | None = None

    def _expire(self, store: Any, keys: list[bytes]) -> None:
        raise NotImplementedError

    @hookimpl
    def kvtier_expire(self, keys: Sequence[bytes], after: float) -> Sequence[bool | None]:
        self.ensure_open()
        if not keys:
            return []
        held = self._lookup(keys)  # a miss already past its deadline, or expired
        clock = self._deadline_clock()
        at = time.monotonic() + after
        with clock.lock:
            for key, found in zip(keys, held, strict=True):
                if found:
                    clock.times.deadline(key, at)
            clock.wake.notify()
        return [True if found else None for found in held]

    def _deadline_clock(self) -> _Clock:
        clock = self._deadline_times
        if clock is None:
            clock = self._deadline_times = _Clock()
            # the reads, on this instance: a block past its deadline is a miss
            for name, miss in (("_get", None), ("_get_into", None), ("_lookup", False)):
                setattr(self, name, clock.filter(getattr(self, name), miss))
            ref = weakref.ref(self)
            threading.Thread(target=clock.run, args=(ref,), daemon=True,
                             name="kvtier-object-deadlines").start()
        return clock


    def _deadlines(self, keys: Sequence[bytes]) -> list[float | None]:
        out: list[float | None] = [None] * len(keys)
        clock = self._deadline_times
        if clock is None:  # no deadline was ever given to this instance
            return out
        with clock.lock:
            at = [None if k in clock.deleting else clock.times.deadline_of(k) for k in keys]
        now = time.monotonic()
        asked = [j for j, a in enumerate(at) if a is not None and a > now]
        if asked:  # a lookup for the keys with a deadline alone: it may ask the bucket
            held = self._lookup([keys[j] for j in asked])  # a block past it: False
            now = time.monotonic()
            for j, found in zip(asked, held, strict=True):
                left = cast(float, at[j]) - now
                if found and left > 0:
                    out[j] = left
        return out


class _Clock:
    """An instance's deadlines, and its thread that deletes the blocks due."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.times: ExpiryClock[bytes] = ExpiryClock(Expiry())
        self.deleting: set[bytes] = set()  # due, their DELETE in flight: still misses

    def past(self, keys: Sequence[bytes]) -> set[bytes]:
        now = time.monotonic()
        with self.lock:
            return {k for k in keys if k in self.deleting or self.times.expired(k, now)}

    def filter(self, read: Callable[..., Sequence[Any]], miss: bool | None
               ) -> Callable[..., Sequence[Any]]:
        """``read`` (a get, scatter read or lookup), answering ``miss`` for a block past
        its deadline."""
        def filtered(keys: Sequence[bytes], *rest: Any) -> Sequence[Any]:
            # past before the read, or after it: a block whose deadline passed, and whose
            # DELETE ran and was done with, while the read was in flight, was read before
            # the DELETE and is past now, though no longer due nor being deleted after it
            before = self.past(keys)
            answers = read(keys, *rest)
            past = before | self.past(keys)
            if not past:
                return answers
            return [miss if k in past else a for k, a in zip(keys, answers, strict=True)]

        return filtered

    def run(self, backend: weakref.ref[Deadlines]) -> None:
        """Delete the blocks due, at their deadlines, until the instance closes."""
        while True:
            with self.lock:
                soonest = self.times.soonest()
                wait = _WAKE_S if soonest is None else min(_WAKE_S, soonest - time.monotonic())
                if wait > 0:
                    self.wake.wait(wait)
                due = self.times.due(time.monotonic())
                self.deleting.update(due)
            owner = backend()
            if owner is None or not owner.is_open:
                return
            if due:
                try:
                    owner._expire(owner._store, due)  # deleted, counted in expired
                except Exception as exc:  # a miss all the same here; tried by no one else
                    log.warning("object tier: deleting %d blocks past their deadline "
                                "failed: %r", len(due), exc)
                with self.lock:
                    self.deleting.difference_update(due)
            del owner
