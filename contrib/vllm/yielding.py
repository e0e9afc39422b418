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
to compute (the last step ended less than :data:`IDLE_GAP` ago: no model ran
in between), it sleeps :data:`IDLE_SLEEP` instead: an idle loop that only
yields still takes the GIL back at once, and on two cores it holds one core
while the reads want both.  A loop that computes (other requests decoding)
is never slowed by more than a yield.  Stores, which no request waits for,
do not make the scheduler yield.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["IDLE_GAP", "IDLE_SLEEP", "StepYield"]

#: A step that starts this soon after the last one ended computed nothing in between.
IDLE_GAP = 0.001
#: How long an idle step sleeps while a request waits on reads.
IDLE_SLEEP = 0.001


class StepYield:
    """The scheduler's yield at the end of a step while a request waits on reads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._clock = clock
        self._sleep = sleep
        self._last_end = float("-inf")

    def __call__(self) -> None:
        """Yield the GIL; sleep a little where the loop steps with nothing to compute."""
        idle = self._clock() - self._last_end < IDLE_GAP
        self._sleep(IDLE_SLEEP if idle else 0)
        self._last_end = self._clock()

    @staticmethod
    def once() -> None:
        """Yield the GIL once (outside the step's end: a poll for finished jobs)."""
        time.sleep(0)
