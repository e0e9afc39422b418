"""What recomputing costs, learned from the engine's own recomputes, and kept in the store.

The load decision (:mod:`kvtier.chain.cost`) weighs a load against the time
the engine would take to recompute the same tokens.  Where the YAML has no
``recompute`` entry, that time is learned here: an integration times each
recompute it can see (for vLLM, from the miss a lookup answered to the store
of the blocks then computed) and feeds ``(tokens, seconds)`` to
:meth:`RecomputeModel.observe`.

Such a time includes whatever the engine did meanwhile: other requests'
prefill and decode, queueing, a slow step.  The estimate
(:class:`RecomputeLearner`) is therefore the low quantile of the recent
per-token rates, so that inflated samples move it little; a sample that
overlapped another timed recompute is dropped, and so is one far above the
estimate (queued behind other work), unless such samples keep coming: then
the machine changed, and the learner starts again from them.

What is learned holds for one machine: the record is keyed by the
namespace (model, dtype, layouts: the catalog's key) and, inside, by the
machine the integration names (device, threads): a new model or another
thread count starts fresh.

The record lives in the first persistent tier of the chain, in the
catalog's namespace (:mod:`kvtier.chain.catalog`), inside the namespace's
descriptor (under ``learned``, which readers of descriptors ignore): the fs
pool keeps a descriptor from eviction while its namespace has blocks or an
open writer, and counts it as it counts its blocks.  The section carries a
schema version and an xxh3 of its content; one that fails either, or a
descriptor of another namespace, is ignored and rewritten at the next
save.  JSON only: nothing read is executed.  A chain without a persistent
tier learns in each process.  A configured ``recompute`` always wins.

Each tier's load cost (:class:`kvtier.chain.cost.LoadCost`) is kept in the
same record, under ``loads`` (a schema and an xxh3 of its own), per tier as
configured (:func:`tier_key`: its name and a digest of its backend and
options): what the chain last measured of the tier, saved at close.  A fresh
process judges a tier found unmeasured by it, once, where it says the tier
is slower than recomputing: it declines the tier without reading it first.
A kept fit that says the tier is fast is not trusted: the tier is measured
by a read as before, so a tier that turned slow is never loaded blindly.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import xxhash

from kvtier.chain import catalog
from kvtier.chain.tier import Tier
from kvtier.config.units import format_duration

__all__ = ["LearnedRate", "LearnedRecord", "RecomputeLearner", "RecomputeLike", "RecomputeModel",
           "machine_key", "open_model", "tier_key"]

log = logging.getLogger("kvtier.chain.learned")

#: Version of the ``learned`` section; another is ignored (and rewritten).
SCHEMA = 1
#: Per-token rates kept: the most recent accepted samples.
WINDOW = 16
#: The estimate is this quantile of the kept rates (the lowest while few).
QUANTILE = 0.1
#: A sample this many times the estimate waited behind other work: dropped...
QUEUED = 3.0
#: ... unless this many come in a row: then the machine changed; start from them.
CHANGED = 4
#: Machines a record keeps (the most recently saved).
MACHINES = 8
#: A changing model is saved at most this often (and at close).
SAVE_INTERVAL = 10.0
#: Version of the ``loads`` section (the tiers' load costs); another is ignored (and rewritten).
LOADS_SCHEMA = 1
#: Tiers' load costs a record keeps (the most recently saved).
LOADS = 16


def tier_key(config: Any) -> str:
    """A tier as the record names its load cost: ``name digest``, the digest over its
    backend, options (secret ones by name only) and codec: another root, bucket or
    backend is another tier."""
    options = {k: None if k in config.secret_options else v for k, v in config.options.items()}
    ident = json.dumps({"backend": config.backend, "options": options, "codec": config.codec,
                        "encrypt": config.encrypt}, sort_keys=True, default=str)
    return f"{config.name} {xxhash.xxh3_64_hexdigest(ident.encode())}"


def machine_key(machine: Mapping[str, Any]) -> str:
    """The machine as the record names it: ``device=cpu threads=2``."""
    return " ".join(f"{k}={machine[k]}" for k in sorted(machine))


def default_machine() -> dict[str, Any]:
    """What an engine-neutral chain knows of its machine: the CPUs it may run on."""
    try:
        threads = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        threads = os.cpu_count() or 1
    return {"threads": threads}


class RecomputeLike(Protocol):
    """What loads are weighed against: the YAML's ``Recompute``, or a :class:`LearnedRate`."""

    @property
    def points(self) -> tuple[tuple[int, float], ...]: ...

    def seconds(self, tokens: int) -> float: ...

    def describe(self) -> str: ...


class LearnedRate:
    """A learned recompute model, shaped like the YAML's ``Recompute``: one rate."""

    def __init__(self, per_token: float) -> None:
        self.points: tuple[tuple[int, float], ...] = ((1, per_token),)

    def seconds(self, tokens: int) -> float:
        return self.points[0][1] * tokens if tokens > 0 else 0.0

    def describe(self) -> str:
        return f"{format_duration(self.points[0][1], 3)}/token"


class RecomputeLearner:
    """The recompute time per token of one engine on one machine, from timed recomputes.

    Not thread-safe (:class:`RecomputeModel` guards it).
    """

    def __init__(self, rates: Sequence[float] = (), samples: int = 0) -> None:
        self.rates: list[float] = list(rates)[-WINDOW:]
        self.samples = max(samples, len(self.rates))  # accepted, ever
        self.dropped = 0  # overlapped or queued, this process
        self._outliers: list[float] = []  # far above the estimate, in a row

    @property
    def rate(self) -> float | None:
        """Seconds a token, or None before the first sample."""
        if not self.rates:
            return None
        ordered = sorted(self.rates)
        return ordered[int(QUANTILE * (len(ordered) - 1))]

    def observe(self, tokens: int, seconds: float, overlapped: bool = False) -> bool:
        """One recompute of ``tokens`` that took ``seconds``; True where it counts.

        ``overlapped``: another timed recompute ran meanwhile (the engine
        batched or queued them), so this time is not this recompute's own.
        """
        if tokens <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return False
        if overlapped:
            self.dropped += 1
            return False
        rate = seconds / tokens
        estimate = self.rate
        if estimate is not None and rate > QUEUED * estimate:
            self._outliers.append(rate)
            if len(self._outliers) < CHANGED:
                self.dropped += 1
                return False
            # slower every time, not now and then: the machine changed
            self.rates, self.samples = [], 0
            for slow in self._outliers[:-1]:
                self._accept(slow)
        self._accept(rate)
        return True

    def _accept(self, rate: float) -> None:
        self._outliers = []
        self.rates = [*self.rates, rate][-WINDOW:]
        self.samples += 1

    def state(self) -> dict[str, Any]:
        return {"rates": list(self.rates), "samples": self.samples}

    @classmethod
    def from_state(cls, state: Any) -> RecomputeLearner | None:
        """The learner a record's entry describes; None for an entry that does not check out."""
        if not isinstance(state, Mapping):
            return None
        rates, samples = state.get("rates"), state.get("samples")
        if not isinstance(rates, list) or not rates or not isinstance(samples, int):
            return None
        if not all(isinstance(r, float) and math.isfinite(r) and r > 0 for r in rates):
            return None
        return cls(rates, samples)


class LearnedRecord:
    """The ``learned`` section of a namespace's descriptor in a persistent tier's catalog.

    ``open_catalog()`` opens the tier on the catalog's namespace (closed
    after each use); ``key`` is the namespace's fingerprint and ``describe``
    its descriptor (:func:`kvtier.chain.catalog.describe`).
    """

    def __init__(self, open_catalog: Callable[[], Any], key: bytes,
                 describe: Mapping[str, Any], where: str) -> None:
        self._open = open_catalog
        self.key = key
        self.describe = dict(describe)
        self.where = where  # the tier's name, for stats

    def load(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Per machine key, its entry, and per tier key, its load cost; each empty where
        the record or its section is absent, damaged or foreign."""
        tier = self._open()
        try:
            payload = tier.get_payloads([self.key])[0]
        finally:
            tier.close()
        return self.machines(payload), self.loads(payload)

    def _learned(self, payload: bytes | None) -> dict[str, Any]:
        """The ``learned`` section of a stored descriptor of this namespace (its fields)."""
        if payload is None or len(payload) > 1 << 20:
            return {}
        try:
            doc = json.loads(payload)
        except ValueError:
            return {}
        if not isinstance(doc, dict) or any(doc.get(k) != v for k, v in self.describe.items()):
            return {}  # another namespace's descriptor, or another format's
        learned = doc.get("learned")
        return learned if isinstance(learned, dict) else {}

    def machines(self, payload: bytes | None) -> dict[str, Any]:
        """The entries of a stored descriptor that checks out: this namespace's fields,
        this schema, the checksum of its entries."""
        learned = self._learned(payload)
        machines = learned.get("machines")
        if learned.get("schema") != SCHEMA or not isinstance(machines, dict):
            return {}
        return machines if learned.get("xxh3") == _digest(machines) else {}

    def loads(self, payload: bytes | None) -> dict[str, Any]:
        """The tiers' load costs of a stored descriptor, where that section checks out."""
        section = self._learned(payload).get("loads")
        if not isinstance(section, dict) or section.get("schema") != LOADS_SCHEMA:
            return {}
        tiers = section.get("tiers")
        if not isinstance(tiers, dict) or section.get("xxh3") != _digest(tiers):
            return {}
        return {k: v for k, v in tiers.items() if isinstance(v, dict)}

    def save(self, machine: str | None, entry: Mapping[str, Any] | None,
             loads: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Store ``entry`` for ``machine`` (None: none new) and ``loads`` (per tier key, its
        load cost), beside the other entries that check out."""
        tier = self._open()
        try:
            payload = tier.get_payloads([self.key])[0]
            machines, tiers = self.machines(payload), self.loads(payload)
            now = time.time()
            if machine is not None and entry is not None:
                machines[machine] = {**entry, "at": now}
            machines = {m: machines[m] for m in sorted(machines, key=lambda m: _at(machines[m]))
                        [-MACHINES:]}
            tiers.update({key: {**cost, "at": now} for key, cost in (loads or {}).items()})
            tiers = {t: tiers[t] for t in sorted(tiers, key=lambda t: _at(tiers[t]))[-LOADS:]}
            learned: dict[str, Any] = {"schema": SCHEMA, "machines": machines,
                                       "xxh3": _digest(machines)}
            if tiers:
                learned["loads"] = {"schema": LOADS_SCHEMA, "tiers": tiers, "xxh3": _digest(tiers)}
            doc = {**self.describe, "learned": learned}
            # a tier skips a put of a key it holds: the old record goes first
            tier.evict([self.key])
            tier.put_payloads([self.key], [json.dumps(doc, sort_keys=True).encode()])
        finally:
            tier.close()


def _digest(machines: Mapping[str, Any]) -> str:
    return xxhash.xxh3_64_hexdigest(json.dumps(machines, sort_keys=True).encode())


def _at(entry: Any) -> float:
    at = entry.get("at") if isinstance(entry, Mapping) else None
    return float(at) if isinstance(at, (int, float)) else 0.0


class RecomputeModel:
    """The recompute model a chain weighs loads against, and where it came from.

    ``configured``: the YAML's ``recompute`` (it wins); else what this
    machine's engine taught the learner, kept in ``record`` (None: this
    process only).  Thread-safe.
    """

    def __init__(self, configured: RecomputeLike | None = None,
                 record: LearnedRecord | None = None) -> None:
        self.configured = configured
        self.record = record
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._stored: dict[str, Any] = {}
        #: per tier key, the load cost an earlier process measured (kvtier.chain.cost)
        self.kept_loads: dict[str, Any] = {}
        if record is not None:  # the tiers' load costs count beside a configured model too
            try:
                machines, self.kept_loads = record.load()
                self._stored = machines if configured is None else {}
            except Exception as exc:  # unreachable: learn in this process
                log.info("kvtier: learned recompute model not read from %r: %r",
                         record.where, exc)
        self._machine: dict[str, Any] = {}
        self.learner = RecomputeLearner()
        self.identify(default_machine())
        self._dirty = False
        self._saved_at = 0.0
        self._saving = False

    def identify(self, machine: Mapping[str, Any]) -> None:
        """The machine the engine runs on (device, threads...), as the integration knows it:
        what was learned on another machine does not hold here."""
        with self._lock:
            if dict(machine) == self._machine:
                return
            self._machine = dict(machine)
            found = RecomputeLearner.from_state(self._stored.get(machine_key(machine)))
            self.learner = found or RecomputeLearner()

    @property
    def source(self) -> str:
        """``configured``, ``learned`` or ``none``."""
        if self.configured is not None:
            return "configured"
        return "learned" if self.learner.rate is not None else "none"

    def current(self) -> RecomputeLike | None:
        """The model in effect: the configured one, else the learned rate, else None."""
        if self.configured is not None:
            return self.configured
        rate = self.learner.rate
        return LearnedRate(rate) if rate is not None else None

    def observe(self, tokens: int, seconds: float, overlapped: bool = False) -> bool:
        """A recompute the engine did (see :meth:`RecomputeLearner.observe`); saved now and then."""
        with self._lock:
            counted = self.learner.observe(tokens, seconds, overlapped)
            self._dirty = self._dirty or counted
            due = (counted and self.record is not None and not self._saving
                   and time.monotonic() - self._saved_at >= SAVE_INTERVAL)
            if due:
                self._saving = True
        if due:
            threading.Thread(target=self.save, name="kvtier-learned-save", daemon=True).start()
        return counted

    def save(self, loads: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Store what was learned, if anything new, and ``loads`` (per tier key, the load
        cost measured in this process); a failure is logged, never raised."""
        # one save at a time, in order: a record is replaced by an evict and a put, and
        # of two puts of one key the second is skipped
        with self._save_lock:
            with self._lock:
                learned = self._dirty and self.learner.rate is not None
                if self.record is None or not (learned or loads):
                    self._saving = False
                    return
                machine, entry = machine_key(self._machine), self.learner.state()
                if learned:
                    self._dirty, self._saved_at = False, time.monotonic()
            try:
                self.record.save(machine if learned else None, entry, loads)
            except Exception as exc:
                log.info("kvtier: learned recompute model not saved to %r: %r",
                         self.record.where, exc)
            finally:
                with self._lock:
                    self._saving = False

    def summary(self) -> dict[str, Any]:
        """``stats()["recompute"]``: ``source``, ``model`` (as the YAML writes it, or None),
        ``per_token_s``, ``samples`` and ``dropped`` (learned), ``machine``, ``kept_in``."""
        with self._lock:
            model = self.current()
            learner = self.learner
            return {
                "source": self.source,
                "model": None if model is None else model.describe(),
                "per_token_s": 0.0 if model is None else model.seconds(1000) / 1000,
                "samples": learner.samples,
                "dropped": learner.dropped,
                "machine": machine_key(self._machine),
                "kept_in": None if self.record is None else self.record.where,
            }


def open_model(configured: Any, tiers: Sequence[Tier], registry: Any) -> RecomputeModel:
    """A chain's model: ``configured`` (the YAML's ``recompute``), else learned and kept in
    the first persistent tier of ``tiers`` that opened, else learned in this process."""
    record = None
    for tier in tiers:
        if tier.capabilities.persistent:
            namespace = tier.namespace
            if namespace.known_fingerprint is None:  # a namespace known only by its fingerprint
                record = LearnedRecord(
                    functools.partial(catalog.open_catalog, tier.config, registry),
                    namespace.fingerprint, catalog.describe(namespace), tier.name)
            break
    return RecomputeModel(configured, record)
