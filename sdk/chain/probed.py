"""Blocks a probe read, kept for the load that follows, so that none is read twice.

Where loads are weighed, a lookup that finds blocks in an unmeasured tier
reads one or two of them to measure it (:meth:`kvtier.chain.cost.LoadDecision.probe`).
An engine that then loads the prefix asks for those blocks again at once:
:meth:`ProbedBlocks.take` serves them from here instead of the tier.  They
were checked when read, as every read's are; one is served once, into a
buffer of its size only, and an evict of its key drops it.  A few are kept,
for a few seconds: a lookup whose prefix is not loaded (declined, or its
request gone) leaves its blocks to be dropped.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from kvtier.spec import BytesLike

__all__ = ["ProbedBlocks"]

#: Blocks kept (the latest read), and for how long: the load follows its lookup at once.
MOST = 4
KEEP_S = 10.0


class ProbedBlocks:
    """Payloads read by probes, by key, each taken once.  Thread-safe."""

    def __init__(self, most: int = MOST, keep_s: float = KEEP_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._most, self._keep_s, self._clock = most, keep_s, clock
        self._lock = threading.Lock()
        self._held: OrderedDict[bytes, tuple[BytesLike, float]] = OrderedDict()

    def hold(self, key: bytes, payload: BytesLike) -> None:
        """Keep ``payload``, the checked block ``key`` a probe read."""
        with self._lock:
            self._held[key] = (payload, self._clock() + self._keep_s)
            self._held.move_to_end(key)
            while len(self._held) > self._most:
                self._held.popitem(last=False)

    def take(self, keys: Sequence[bytes], outs: Sequence[memoryview]) -> set[int]:
        """Fill ``outs[i]`` with the held block ``keys[i]`` where one of that size is held
        and fresh; the indices filled (their blocks are no longer held)."""
        filled: set[int] = set()
        with self._lock:
            if not self._held:
                return filled
            now = self._clock()
            for i, key in enumerate(keys):
                held = self._held.pop(key, None)
                if held is None or held[1] < now:
                    continue
                payload = memoryview(held[0]).cast("B")
                if payload.nbytes == outs[i].nbytes:
                    outs[i][:] = payload
                    filled.add(i)
        return filled

    def drop(self, keys: Iterable[bytes]) -> None:
        """Forget ``keys`` (evicted: a block put again under one is read from its tier)."""
        with self._lock:
            for key in keys:
                self._held.pop(key, None)
