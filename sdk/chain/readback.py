"""A tier's load cost, learned off the critical path by reading back blocks it just stored.

Where loads are weighed, a tier nothing has measured is probed at the first
lookup that finds blocks in it (:meth:`kvtier.chain.cost.LoadDecision.probe`):
reads on that request's path.  The process that computed a prompt and
stored it never loaded from the tier, so without more it keeps no load cost
for it, and the next process probes.  So the chain measures a tier it
stores into while the tier is unmeasured: once its stores have stopped for
:data:`QUIET_S` (the tier idle, the engine's request long answered), a
thread of its own reads back the last blocks stored (:data:`READS`, the
faster read counts, as a probe's do), through the tier's own read path
(:meth:`kvtier.chain.tier.Tier.get_blobs`: checked as every read is, counted
as no hit; a block gone or damaged since is no sample), and feeds the time to
the tier's fit as a ``read-back`` sample, which the chain keeps at close
beside the recompute model.  What is left due at close is read then.  A
fault of the tier in a read-back is counted in its ``errors`` and in
:attr:`ReadBack.failures` (``stats()``'s ``read_back_failures``) and logged,
but trips none of its breakers: a measurement is no request, and the
requests' reads go on.

What it measures is what the tier's read path takes right after the write.
Where a cache the write filled serves that read (a buffered fs write in the
page cache, a write-back object tier's local copy), the read-back is fast
and the tier looks fast; a later process never declines a tier on a kept
fit that says it is fast (it probes it), so a cache can cost a probe, never
a wrong decline.  The fs tier writes large blocks with O_DIRECT, so its
read-back reads the disk.  At most one read-back a tier every
:data:`INTERVAL_S`, and none where reads measured the tier meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from kvtier.spec import ClosedError

__all__ = ["INTERVAL_S", "QUIET_S", "READS", "ReadBack"]

log = logging.getLogger("kvtier.chain")

#: A tier's stores stopped this long: it is idle, and the request that stored is answered.
QUIET_S = 2.0
#: At most one read-back of a tier this often.
INTERVAL_S = 60.0
#: Blocks read back (the last ones stored); the faster read counts.
READS = 2
#: Why blocks enter a tier that a read-back follows (a promotion came from below).
_WRITES = frozenset({"put", "through", "demote"})


class Decision(Protocol):
    """What a read-back asks of :class:`kvtier.chain.cost.LoadDecision`."""

    def wants_read_back(self, tier: int) -> bool: ...

    def read_back(self, tier: int, nbytes: int, seconds: float) -> None: ...


Emit = Callable[[Any, int, Iterable[bytes], str], None]


class ReadBack:
    """Read-backs of a chain's tiers (``tiers``: objects with ``get_payloads``).  Thread-safe."""

    def __init__(self, decision: Decision, tiers: Sequence[Any], quiet_s: float | None = None,
                 interval_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._decision, self._tiers, self._clock = decision, tiers, clock
        self._quiet_s = QUIET_S if quiet_s is None else quiet_s  # read here: a test sets them
        self._interval_s = INTERVAL_S if interval_s is None else interval_s
        self._cond = threading.Condition()
        self._due: dict[int, tuple[list[bytes], float]] = {}  # tier -> last keys stored, when
        self._done: dict[int, float] = {}  # tier -> when it was last read back
        self._thread: threading.Thread | None = None
        self._closed = False
        self.counts = [0] * len(tiers)  # blocks read back, per tier
        self.failures = [0] * len(tiers)  # read-backs a fault of the tier ended, per tier

    def after(self, emit: Emit) -> Emit:
        """``emit`` (the chain's events), noting first what each write stored."""
        def emit_and_note(kind: Any, index: int, keys: Iterable[bytes], reason: str) -> None:
            if kind == "stored" and reason in _WRITES and self._wanted(index):
                keys = list(keys)
                if keys:
                    self._stored(index, keys)
            emit(kind, index, keys, reason)
        return emit_and_note

    def _wanted(self, index: int) -> bool:
        if self._closed:
            return False
        done = self._done.get(index)
        if done is not None and self._clock() - done < self._interval_s:
            return False
        return self._decision.wants_read_back(index)

    def _stored(self, index: int, keys: list[bytes]) -> None:
        with self._cond:
            if self._closed:
                return
            earlier = self._due.get(index, ([], 0.0))[0]
            self._due[index] = ([*earlier, *keys][-READS:], self._clock())
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvtier-read-back",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed and self._due:
                now = self._clock()
                ready = [i for i, (_, at) in self._due.items() if now - at >= self._quiet_s]
                if not ready:
                    wait = min(at for _, at in self._due.values()) + self._quiet_s - now
                    self._cond.wait(max(wait, 0.01))
                    continue
                index = ready[0]
                keys, _ = self._due.pop(index)
                self._done[index] = now
                self._cond.release()
                try:
                    self._read(index, keys)
                finally:
                    self._cond.acquire()
            self._thread = None

    def _read(self, index: int, keys: list[bytes]) -> None:
        """Read ``keys`` back from tier ``index``; the faster read is a sample of its cost."""
        if not self._decision.wants_read_back(index):  # reads measured it meanwhile
            return
        fastest: tuple[float, int] | None = None
        for key in reversed(keys):
            start = time.perf_counter()
            try:
                # checked as every read is, but not a hit: a measurement serves no one; its
                # fault is counted in the tier's errors, and backs the tier off for no one
                payload = self._tiers[index].get_blobs([key], counted=False, measure=True)[0]
            except ClosedError:  # the chain closes: nothing to measure
                return
            except Exception as exc:  # no sample, the chain goes on
                self.failures[index] += 1
                log.warning("kvtier: read-back of tier %d failed (the tier serves on): %r",
                            index, exc)
                return
            seconds = time.perf_counter() - start
            if payload is None:  # gone, or damaged (counted by the tier): no sample
                continue
            self.counts[index] += 1
            if fastest is None or seconds < fastest[0]:
                fastest = (seconds, len(payload))
        if fastest is not None:
            self._decision.read_back(index, fastest[1], fastest[0])

    def close(self) -> None:
        """Stop; read back now what is still due (the chain closes: its tiers are idle)."""
        with self._cond:
            self._closed = True
            due, self._due = self._due, {}
            thread = self._thread
            self._cond.notify_all()
        if thread is not None:
            thread.join()
        for index, (keys, _) in due.items():
            self._read(index, keys)
