"""What the vLLM tier knows about each key: lookup answers that never wait on storage.

vLLM asks about one key at a time and expects an answer at once.  The first
question about a key answers ``RETRY`` and queues the key; the tier sends a
scheduler step's queue to the chain as one lookup job and answers later
questions from its result, for ``verdict_ttl`` seconds.  A question still
unanswered after ``lookup_timeout`` seconds is a ``MISS``.  Loads and stores
leave verdicts here too: a key just stored or loaded is a ``HIT``, one that
failed to load a ``MISS`` (for ``failed_ttl`` seconds).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from kvtier.spec import KvtierError

from ._compat import LookupResult
from .tier_metrics import AdapterCounters

__all__ = ["HIT", "MISS", "LookupVerdicts", "worth_loading"]

log = logging.getLogger("kvtier.vllm")

_PENDING, _IN_FLIGHT, HIT, MISS = range(4)


class _Probe:
    """What the tier knows about one key."""

    __slots__ = ("expires", "since", "state")

    def __init__(self, state: int, since: float, expires: float = 0.0) -> None:
        self.state = state
        self.since = since
        self.expires = expires


_Batch = list[tuple[bytes, _Probe]]


class _Looks(Protocol):
    """What a lookup job is sent to: a chain, or the tier's router to its tenants' chains."""

    def submit_lookup(self, keys: Sequence[bytes]) -> int: ...


class LookupVerdicts:
    """Verdicts by kvtier key, and the lookup jobs in the chain; guarded by the tier's lock."""

    def __init__(
        self, lookup_timeout: float, verdict_ttl: float, counters: AdapterCounters
    ) -> None:
        self._lookup_timeout = lookup_timeout
        self._verdict_ttl = verdict_ttl
        self._counters = counters
        self._probes: dict[bytes, _Probe] = {}
        self._queued: list[bytes] = []
        self._in_flight: dict[int, _Batch] = {}  # chain job -> its keys

    @property
    def waiting(self) -> bool:
        """Whether a lookup job is in the chain (a request waits on its answer)."""
        return bool(self._in_flight)

    def in_flight(self) -> list[int]:
        """The chain jobs of the lookups in flight."""
        return list(self._in_flight)

    def answer(self, key: bytes, now: float) -> Any:
        """vLLM's ``LookupResult`` for ``key`` now; ``RETRY`` queues a question to the chain."""
        probe = self._probes.get(key)
        if probe is None or (probe.state >= HIT and probe.expires <= now):
            self._probes[key] = _Probe(_PENDING, now)
            self._queued.append(key)
            return LookupResult.RETRY
        if probe.state == HIT:
            self._counters.count("lookup_keys", "hit")
            return LookupResult.HIT
        if probe.state == MISS:
            self._counters.count("lookup_keys", "miss")
            return LookupResult.MISS
        if now - probe.since > self._lookup_timeout:
            probe.state, probe.expires = MISS, now + self._verdict_ttl
            self._counters.count("lookup_keys", "timeout")
            return LookupResult.MISS
        return LookupResult.RETRY

    def take_queued(self) -> _Batch:
        """The queued keys still waiting for the chain (the queue is emptied)."""
        queued, self._queued = self._queued, []
        return [
            (k, p) for k in queued
            if (p := self._probes.get(k)) is not None and p.state == _PENDING
        ]

    def submit(self, chain: _Looks, batch: _Batch, now: float) -> None:
        """Ask the chain about ``batch`` in one lookup job; a chain closing answers misses."""
        for _, probe in batch:
            probe.state = _IN_FLIGHT
        try:
            job = chain.submit_lookup([k for k, _ in batch])
        except KvtierError as exc:
            log.debug("kvtier lookup not submitted: %s", exc)
            for _, probe in batch:
                probe.state, probe.expires = MISS, now + self._verdict_ttl
            return
        self._in_flight[job] = batch

    def answered(
        self, job_id: int, where: list[Any] | None, now: float, chain: Any = None
    ) -> None:
        """A lookup job's result (None: it failed, every key a miss); held keys the
        ``chain``'s load policy finds faster to recompute are misses."""
        batch = self._in_flight.pop(job_id, None)
        if batch is None:
            return
        if where is None:
            where = [None] * len(batch)
        elif chain is not None:
            where = worth_loading(chain, where)
        for (key, probe), tier in zip(batch, where):
            if self._probes.get(key) is probe and probe.state == _IN_FLIGHT:
                probe.state = MISS if tier is None else HIT
                probe.expires = now + self._verdict_ttl

    def holds(self, key: bytes, now: float) -> bool:
        """Whether the chain is known to hold ``key`` (a fresh ``HIT``)."""
        probe = self._probes.get(key)
        return probe is not None and probe.state == HIT and probe.expires > now

    def remember(self, keys: Iterable[bytes], state: int, ttl: float, now: float) -> None:
        """``HIT`` or ``MISS`` for ``keys`` for ``ttl`` seconds, learnt from a load or store."""
        for key in keys:
            probe = self._probes.get(key)
            if probe is None:
                self._probes[key] = _Probe(state, now, now + ttl)
            else:
                probe.state, probe.expires = state, now + ttl

    def prune(self, now: float) -> None:
        """Forget expired verdicts and questions left unanswered past ``lookup_timeout``."""
        stale = [
            k for k, p in self._probes.items()
            if (p.state >= HIT and p.expires <= now)
            or (p.state == _PENDING and now - p.since > self._lookup_timeout)
        ]
        for k in stale:
            del self._probes[k]

    def drop_in_flight(self) -> None:
        """Forget the lookup jobs in the chain (it closed: their answers will not come)."""
        self._in_flight.clear()


def worth_loading(chain: Any, where: list[Any]) -> list[Any]:
    """``where`` (a lookup job's answer: per key, the tier holding it) with the held
    keys that the chain's ``load_policy`` finds faster to recompute as ``None``.

    A job gathers keys of several requests, so there is no one prefix to weigh:
    each tier's keys are weighed together, as one load of that many blocks (a
    latency that many blocks share counts once), and the first ones that pay
    are kept.  A chain without the policy (a stand-in while unopened) keeps all.
    """
    weigh = getattr(chain, "worth_loading", None)
    if weigh is None:
        return where
    by_tier: dict[int, list[int]] = {}
    for i, tier in enumerate(where):
        if tier is not None:
            by_tier.setdefault(tier, []).append(i)
    out = list(where)
    for tier, held in by_tier.items():
        for i in held[weigh([tier] * len(held)) :]:
            out[i] = None
    return out
