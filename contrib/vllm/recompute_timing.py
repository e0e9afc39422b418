"""Timing vLLM's recomputes, to teach the chain what recomputing costs.

vLLM 0.32 gives a tier no step timings (its ``ScheduleEndContext`` names only
new and preempted requests), but a tier sees both ends of a recompute: the
``MISS`` it answers to a lookup (vLLM then computes the request's tokens from
that block on) and the store of the blocks computed then (vLLM hands every
block it stores in its CPU tier to the tier, :meth:`KvtierTier.submit_store`).
The time between them, over the tokens of the stored blocks, is what vLLM
took a token: its prefill, the copy to its CPU tier, and the steps in
between.  :class:`RecomputeTimer` takes that time per request, once (the
first store after the miss: later stores are decode steps or later chunks),
and feeds it to the chain's :class:`~kvtier.chain.learned_cost.RecomputeModel`.
vLLM computes after the scheduler step that heard the miss ends
(``on_schedule_end``), so a store before that end computed nothing there:
not timed.

A recompute timed while another request's was (batched with it, or queued
behind it), or while another request's load began (its reads and the
compute of the tokens after its hit share the engine), is fed as
``overlapped``, and the model drops it.  The machine is
named by vLLM's device, its worker count and torch's threads, so that what
was learned on another machine (or with other threads) is not used here.
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections import deque
from typing import Any

from ._compat import LookupResult, current_platform

__all__ = ["RecomputeTimer", "engine_machine"]

log = logging.getLogger("kvtier.vllm")

#: A miss whose blocks are not stored within this many seconds is forgotten
#: (the request ended, or vLLM's CPU tier refused its blocks).
_OPEN_S = 120.0


def engine_machine(offloading_spec: Any) -> dict[str, Any]:
    """What the learned recompute model holds for: device, workers, threads."""
    machine: dict[str, Any] = {}
    try:
        machine["device"] = str(current_platform.device_type)
        if machine["device"] != "cpu":
            machine["device"] += ":" + str(current_platform.get_device_name())
    except Exception:  # an odd platform: the other fields still tell machines apart
        machine["device"] = "unknown"
    parallel = getattr(getattr(offloading_spec, "config", None), "parallel", None)
    machine["workers"] = int(getattr(parallel, "world_size", 1) or 1)
    torch = sys.modules.get("torch")
    if torch is not None:
        machine["threads"] = int(torch.get_num_threads())
    return machine


class RecomputeTimer:
    """Recomputes timed from a lookup's miss to the store of their blocks; guarded by the
    tier's lock."""

    def __init__(self, namespace: Any, offloading_spec: Any) -> None:
        self._tokens = int(namespace.tokens_per_block)  # a key's
        self._machine = engine_machine(offloading_spec)
        self._open: dict[str, tuple[float, int]] = {}  # request -> its miss: when, which step
        self._steps = 0  # scheduler steps ended
        self._loads: dict[str, float] = {}  # requests that also load blocks: not timed
        self._closed: deque[float] = deque()  # when timed recomputes ended, recent ones
        self._identified: weakref.WeakSet[Any] = weakref.WeakSet()

    def looked_up(self, chain: Any, req_context: Any, answer: Any, now: float) -> Any:
        """A lookup answered ``answer`` for a request; a ``MISS`` starts its recompute.
        Returns ``answer``."""
        self._identify(chain)
        req_id = getattr(req_context, "req_id", None)
        if req_id is None or not self._tokens:
            return answer
        if answer is LookupResult.MISS:
            self._open.setdefault(req_id, (now, self._steps))
        elif answer is LookupResult.HIT:  # its wait for the load is no recompute
            self._loads[req_id] = now
        return answer

    def step(self) -> None:
        """A scheduler step ended: what it scheduled is computed from here on."""
        self._steps += 1

    def stored(self, chain: Any, job: Any, keys: int, now: float) -> None:
        """vLLM stores ``keys`` blocks of a request (store job ``job``): where its miss
        is open, the recompute ends here and is fed to the chain's model."""
        req_id = getattr(getattr(job, "req_context", None), "req_id", None)
        self._forget(now)
        if not isinstance(req_id, str):
            return
        missed = self._open.pop(req_id, None)
        if missed is None or keys <= 0 or missed[1] == self._steps:
            return
        start = missed[0]
        waited = self._loads.pop(req_id, None) is not None  # for a load: no recompute time
        loading = any(start <= hit <= now for hit in self._loads.values())  # another's load
        overlapped = (waited or loading or bool(self._open)
                      or any(end > start for end in self._closed))
        self._closed.append(now)
        model = getattr(chain, "recompute", None)
        if model is None:  # the stand-in of a chain that did not open
            return
        self._identify(chain)
        tokens = keys * self._tokens
        counted = model.observe(tokens, now - start, overlapped)
        log.debug("kvtier: recompute of %d tokens took %.3f s%s", tokens, now - start,
                  "" if counted else " (not counted)")

    def _identify(self, chain: Any) -> None:
        model = getattr(chain, "recompute", None)
        if model is not None and chain not in self._identified:
            model.identify(self._machine)
            self._identified.add(chain)

    def _forget(self, now: float) -> None:
        for req_id in [r for r, (t, _) in self._open.items() if now - t > _OPEN_S]:
            del self._open[req_id]
        for req_id in [r for r, t in self._loads.items() if now - t > _OPEN_S]:
            del self._loads[req_id]
        while self._closed and now - self._closed[0] > _OPEN_S:
            self._closed.popleft()
