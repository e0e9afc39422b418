"""How the scheduler thread lets the chain's reads run while a request waits on them.

vLLM calls the tier on its scheduler thread, in a loop that holds the GIL.
A request whose blocks are being read waits while that loop steps, and the
backends' per-block Python work (a GET's body copied into the engine's
rows, a check) waits for each handover of the GIL: a thread that never
blocks hands it over only once per switch interval (5 ms).  On vLLM's CPU
build a cold 64-block (128 MiB) load took 0.36-0.45 s in the engine against
0.17 s alone.

So while a request waits on reads the tier yields at each step
(``time.sleep(0)``), and where the loop is **idle**, stepping with nothing
to compute, it waits instead for the reads to land, :data:`IDLE_SLEEP` at
most: an idle loop that only yields takes the GIL back at once, and on two
cores it holds one core while the reads want both.

An idle loop that a request joins while a load is in flight takes it up at
most :data:`IDLE_SLEEP` later: the price of the CPU the steps leave to the
reads.

A step is idle where the scheduler thread ran less than :data:`IDLE_CPU` of
CPU since the last step ended (``time.thread_time``), and no more than
:data:`IDLE_WALL` of wall time passed.  The CPU time is the signal: an idle
step of vLLM's CPU build runs 0.3-0.6 ms of Python, while a step that
computes runs the model on that thread.  The wall time between steps is no
signal on its own: while the reads run, an idle step waits for the GIL, and
its wall time grows past any bound an idle step keeps alone (1 ms judged
fewer than half of the idle steps idle, in the object tier's hit).  The wall
bound keeps out a step that waited long on something else (a device, a
worker process).  A loop that computes (other requests decoding) is never
slowed by more than a yield.  Stores, which no request waits for, do not
make the scheduler yield.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["IDLE_CPU", "IDLE_SLEEP", "IDLE_WALL", "StepYield"]

#: A step whose thread ran less CPU than this since the last step ended computed nothing.
IDLE_CPU = 0.001
#: ... unless more wall time than this passed: it waited on a device or a worker.
IDLE_WALL = 0.005
#: How long an idle step waits for the reads, at most: the wait ends as soon as they
#: land, so it bounds only how late an idle loop takes up a request that arrives
#: meanwhile.  Each idle step runs 0.3-0.6 ms of Python and vLLM's lookups, CPU the
#: reads (and, on a small machine, the bucket's server) want: 2 ms put a 128 MiB
#: object-tier load at 193 ms, 10 ms at 159 ms, against 147 ms for a raw GET of the
#: same objects (BENCHMARKS.md, "Object bodies received in place").
IDLE_SLEEP = 0.010


class StepYield:
    """The scheduler's yield at the end of a step while a request waits on reads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 cpu: Callable[[], float] = time.thread_time,
                 sleep: Callable[[float], object] = time.sleep) -> None:
        self._clock = clock
        self._cpu = cpu
        self._sleep = sleep
        self._last_end = float("-inf")
        self._last_cpu = float("-inf")

    def __call__(self, wait: Callable[[float], object] | None = None) -> None:
        """Yield the GIL; where the loop steps with nothing to compute, wait up to
        :data:`IDLE_SLEEP` on ``wait(timeout)`` (one that returns once the reads
        landed), or sleep that long."""
        idle = (self._cpu() - self._last_cpu < IDLE_CPU
                and self._clock() - self._last_end < IDLE_WALL)
        if idle and IDLE_SLEEP > 0:
            (wait or self._sleep)(IDLE_SLEEP)
        else:
            self._sleep(0)
        self._last_end = self._clock()
        self._last_cpu = self._cpu()

    @staticmethod
    def once() -> None:
        """Yield the GIL once (outside the step's end: a poll for finished jobs)."""
        time.sleep(0)
