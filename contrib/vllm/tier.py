"""``KvtierTier``: one kvtier chain as one vLLM secondary tier.

vLLM's ``TieringOffloadingManager`` calls every method here on the scheduler
thread and expects each to return at once.  Nothing here waits for storage:

lookup
    The first ``lookup`` of a key answers ``RETRY`` and queues the key; at the
    end of the scheduler step (``on_schedule_end``) the step's queued keys go
    to the chain as ONE ``Chain.submit_lookup``.  A later ``lookup`` of the key
    answers from the result (``HIT``/``MISS``), kept for ``verdict_ttl``
    seconds.  A lookup still unanswered after ``lookup_timeout`` seconds is a
    ``MISS`` (the request recomputes rather than waits on a stuck store).
submit_store / submit_load
    ``Chain.submit_put`` / ``Chain.submit_get`` straight on the rows of vLLM's
    primary region (memoryview slices of ``primary_kv_view``): the chain's
    first tier reads from, or writes into, vLLM's host memory; no staging
    copy.  Keys this tier knows it holds are not stored again.
get_finished_jobs
    Turns ``Chain.poll()`` results into vLLM ``JobResult`` s: a load with some
    keys missing or rejected (checksum) reports the loaded ones as
    ``successful_keys``, so vLLM recomputes only the rest.  ``transfer_time``
    runs from submission to the first poll that sees the job finished.

Failures.  A key that failed to load is a miss for ``failed_ttl`` seconds,
and when vLLM stores the recomputed chunk, any block still held for the key
is evicted first and then replaced (a tier skips a put of a key it holds;
one that failed its checks was dropped when it was read).
A backend that fails at run time is skipped by the chain (misses, retried
after a back-off); one whose storage is unreachable when vLLM starts leaves
the tier empty until a later attempt (every ``reopen_interval`` seconds)
opens the chain.  No storage fault reaches vLLM as an exception.

Keys.  vLLM's ``OffloadKey`` (block hash + 4-byte KV-group index, 36 bytes
with the default SHA-256 prefix hashing) is used as the kvtier key as is.  A
kvtier key is at most 64 bytes (it names files and objects and sits in every
block header); a longer vLLM key is replaced by its 32-byte BLAKE2b digest,
which keeps keys distinct and still checked against the stored header.

Namespace.  Every block is stored under a :class:`kvtier.Namespace` made from
vLLM's offloading config: model, KV dtype, tokens per chunk, the row layout
(KV cache layout, row bytes, blocks per chunk, tokens per hash, groups and
their layers, canonical/replicated flags, vLLM release) and the parallel
layout (tp/pp/pcp/dcp, world size, rank).  Blocks from any other
configuration are misses.  ``namespace_extra`` adds fields of your own.

KV events.  With vLLM's KV cache events on, the tier listens to its chain
(:meth:`kvtier.Chain.add_listener`) and reports through ``take_events`` the
chunks vLLM stored in the chain and those no kvtier tier holds any more
(capacity evictions in any tier, evictions, purges), as ``OffloadingEvent``
with ``Medium.STORAGE``.

Stats.  vLLM's metric hooks work in 0.32: :meth:`KvtierTier.build_metric_definitions`
declares counters (``vllm:kv_offload_kvtier_*``, per kvtier tier) and
:meth:`KvtierTier.get_stats` reports what changed, so they appear on vLLM's
``/metrics`` and in ``LLM.get_metrics()`` when stats logging is on.  The
chain's own ``metrics:`` section (Prometheus port, ``log_interval`` log line)
works as well; its log line is routed to vLLM's log handlers.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

from kvtier.block.namespace import Namespace
from kvtier.chain import Chain, ChainEvent
from kvtier.chain import JobResult as ChainJobResult
from kvtier.config import load_config
from kvtier.spec import MAX_KEY_SIZE, ConfigError, KvtierError

from ._compat import (
    HAS_DEFERRED_RELEASE,
    VLLM_VERSION,
    LookupResult,
    Medium,
    OffloadingConnectorStats,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    SecondaryTierManager,
    TransferJob,
    adopt_vllm_logging,
    job_result,
    kv_events_enabled,
    locality_of,
    offloading_fields,
    row_payload_bytes,
)
from .transfer_config import secondary_chain_config

__all__ = ["METRIC_PREFIX", "KvtierTier", "chain_key", "live_tiers", "namespace_for"]

log = logging.getLogger("kvtier.vllm")

#: Prefix of the metrics this tier reports through vLLM.
METRIC_PREFIX = "vllm:kv_offload_kvtier_"
_TIER_LABEL = ("kvtier_tier",)
#: Per kvtier tier: (chain stats key, metric suffix, help).
_TIER_COUNTERS = (
    ("hits", "hits", "Blocks served by a kvtier tier."),
    ("misses", "misses", "Blocks asked of a kvtier tier and not found there."),
    ("corrupt", "corrupt_blocks", "Blocks a kvtier tier rejected by a format or checksum check."),
    ("errors", "errors", "Faults of a kvtier tier's backend."),
    ("bytes_out", "served_bytes", "Payload bytes served by a kvtier tier."),
    ("bytes_in", "written_bytes", "Payload bytes written to a kvtier tier."),
    ("evictions", "evictions", "Blocks a kvtier tier dropped for capacity."),
    ("promoted", "promoted_blocks", "Blocks copied up into a kvtier tier from one below."),
    ("dropped", "dropped_writes", "Asynchronous writes a kvtier tier abandoned."),
)
#: Adapter counters: (name, label names, help).
_ADAPTER_COUNTERS = (
    ("lookup_keys", ("result",), "Chunk lookups answered by the kvtier tier: hit, miss, timeout."),
    ("load_keys", ("outcome",), "Chunks the kvtier tier was asked to load: ok, failed."),
    ("store_keys", ("outcome",), "Chunks the kvtier tier was asked to store: ok, failed, skipped."),
    ("dropped_keys", ("reason",), "Blocks removed from the chain after they failed to load."),
    ("kv_events", ("kind",), "Blocks in KV events the kvtier tier gave vLLM: stored, removed."),
)
_HEALTHY = "tier_healthy"
_CONFIG_INFO_KEYS = ("kvtier_chain", "kvtier_namespace", "kvtier_chunk_bytes")

_PENDING, _IN_FLIGHT, _HIT, _MISS = range(4)

_live: weakref.WeakSet[KvtierTier] = weakref.WeakSet()


def _yield_gil() -> None:
    """Let the chain's I/O threads take the GIL now (called while a request waits on reads).

    A scheduler stepping in a tight loop hands the GIL over only once per
    switch interval (5 ms), and the backends' per-block Python work waits
    for every handover: on vLLM's CPU build a cold 64-block (128 MiB) load
    took 0.36-0.45 s instead of the 0.17 s the same read takes alone.
    Yielding once per step brings it to about 0.25 s; stores, which no
    request waits for, do not make the scheduler yield.
    """
    time.sleep(0)


def live_tiers() -> list[KvtierTier]:
    """The open ``KvtierTier`` instances of this process (for in-process inspection)."""
    return [t for t in list(_live) if not t.closed]


def chain_key(key: bytes) -> bytes:
    """The kvtier key for a vLLM ``OffloadKey``: itself, or its digest if over 64 bytes."""
    if 0 < len(key) <= MAX_KEY_SIZE:
        return bytes(key)
    return hashlib.blake2b(bytes(key), digest_size=32, person=b"kvtier-vllm-key").digest()


def namespace_for(
    offloading_config: Any,
    row_bytes: int,
    extra: Mapping[str, Any] | None = None,
    model: str | None = None,
) -> Namespace:
    """The :class:`~kvtier.Namespace` of vLLM chunk rows of ``row_bytes`` bytes.

    ``model`` replaces vLLM's model name (a hub id or a local path), for
    engines that load the same weights from different paths.
    """
    f = offloading_fields(offloading_config)
    groups = f["groups"]
    tokens_per_chunk = groups[0]["tokens_per_block"] * f["blocks_per_chunk"] if groups else 0
    layers = hashlib.blake2b(
        json.dumps([g["layer_names"] for g in groups]).encode(), digest_size=8
    ).hexdigest()
    layout = [
        "vllm-offload-row",
        f"layout={f['kv_cache_layout']}",
        f"row_bytes={row_bytes}",
        f"blocks_per_chunk={f['blocks_per_chunk']}",
        f"tokens_per_hash={f['tokens_per_hash']}",
        "groups=" + ",".join(f"{g['tokens_per_block']}x{g['layers']}" for g in groups),
    ]
    if f["canonical_layout"]:
        layout.append("canonical")
    if f["replicated_layout"]:
        layout.append("replicated")
    release = ".".join(VLLM_VERSION.split(".")[:2])
    fields: dict[str, str] = {"engine": f"vllm-{release}", "layers": layers}
    fields.update({str(k): str(v) for k, v in (extra or {}).items()})
    return Namespace(
        model=model or f["model"],
        dtype=f["dtype"],
        tokens_per_block=tokens_per_chunk,
        kv_layout=";".join(layout),
        parallel_layout=(
            f"tp{f['tp']}-pp{f['pp']}-pcp{f['pcp']}-dcp{f['dcp']}"
            f"-world{f['world_size']}-rank{f['rank']}"
        ),
        extra=fields,
    )


class _NoChain:
    """Stands in for a chain that could not be opened: holds nothing, takes nothing.

    Jobs finish as they are submitted (ids are negative, never a real chain's).
    """

    def __init__(self, error: str) -> None:
        self.error = error
        self.tiers: list[Any] = []
        self._ids = itertools.count(-1, -1)
        self._done: list[ChainJobResult] = []

    def _job(self, kind: Literal["put", "get", "lookup"], result: list[Any]) -> int:
        job_id = next(self._ids)
        self._done.append(ChainJobResult(job_id, kind, result))
        return job_id

    def submit_lookup(self, keys: Sequence[bytes]) -> int:
        return self._job("lookup", [None] * len(keys))

    def submit_put(self, keys: Sequence[bytes], blocks: Sequence[Any]) -> int:
        return self._job("put", [False] * len(keys))

    def submit_get(self, keys: Sequence[bytes], out: Sequence[Any]) -> int:
        return self._job("get", [False] * len(keys))

    def put(self, keys: Sequence[bytes], blocks: Sequence[Any]) -> list[bool]:
        return [False] * len(keys)

    def evict(self, keys: Sequence[bytes]) -> int:
        return 0

    def poll(self) -> list[ChainJobResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: Iterable[int] | None = None, timeout: float | None = None) -> bool:
        return True

    def stats(self) -> dict[str, Any]:
        return {"namespace": "", "tiers": [], "pending_writes": 0, "unavailable": self.error}

    def close(self) -> None:
        return None


class _Probe:
    """What this tier knows about one key."""

    __slots__ = ("expires", "since", "state")

    def __init__(self, state: int, since: float, expires: float = 0.0) -> None:
        self.state = state
        self.since = since
        self.expires = expires


@dataclass
class _Job:
    vllm_id: int
    load: bool
    keys: Sequence[bytes]  # vLLM keys, in the order given to the chain
    submitted: float
    skipped: int = 0


class KvtierTier(SecondaryTierManager):  # type: ignore[misc, unused-ignore]
    """A kvtier chain as a vLLM secondary tier (see the module docstring).

    Keyword arguments, from the ``secondary_tiers`` entry:

    ``config`` (required)
        Path of the kvtier YAML.
    ``namespace_extra``
        Mapping of extra namespace fields (a deployment tag, a KV quantiser).
    ``model_name``
        The model's identity in the namespace instead of vLLM's model name
        (engines loading the same weights from different local paths).
    ``keep_host_tier``
        Open a leading ``host`` tier too (default false: vLLM's CPU tier
        already holds those blocks; see :func:`secondary_chain_config`).
    ``lookup_timeout``
        Seconds a lookup may stay unanswered before it counts as a miss (2).
    ``verdict_ttl``
        Seconds a lookup answer is reused (2).
    ``failed_ttl``
        Seconds a key stays a miss after a failed load (30), so a damaged
        block is not fetched again for every request.
    ``job_workers``
        Threads running the chain's asynchronous jobs (8).
    ``reopen_interval``
        A chain whose storage is unreachable at start-up (a backend's open
        fails with an I/O error) does not stop vLLM: the tier holds nothing
        and tries to open the chain again every this many seconds (30).
    ``locality``
        ``LOCAL`` or ``REMOTE``, passed on to vLLM (default: unset).
    ``load_timeout``
        vLLM 0.34 and later: seconds a load may run before the tier reports
        it failed (vLLM recomputes) with ``deferred_release`` set, so vLLM
        keeps the primary slots out of use until the read has really ended
        (default: unset, a load is reported when it ends).
    """

    medium: ClassVar[Any] = Medium.STORAGE
    #: vLLM 0.33+: this tier serves no peers, so nothing needs it polled between
    #: engine steps; its lock would allow it.
    tolerates_off_thread_polling: ClassVar[bool] = False

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        *,
        config: str | None = None,
        namespace_extra: Mapping[str, Any] | None = None,
        model_name: str | None = None,
        keep_host_tier: bool = False,
        lookup_timeout: float = 2.0,
        verdict_ttl: float = 2.0,
        failed_ttl: float = 30.0,
        job_workers: int = 8,
        reopen_interval: float = 30.0,
        locality: str | None = None,
        load_timeout: float | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        if not config:
            raise ConfigError(
                f"secondary tier {tier_type!r} needs 'config': the path of a kvtier YAML"
            )
        if locality is not None:
            self.locality = locality_of(locality)
        self._row = int(self.block_size_bytes)
        self._payload = row_payload_bytes(offloading_spec, self._row)
        self._lookup_timeout = float(lookup_timeout)
        self._verdict_ttl = float(verdict_ttl)
        self._failed_ttl = float(failed_ttl)
        if load_timeout is not None and not HAS_DEFERRED_RELEASE:
            raise ConfigError(
                f"'load_timeout' needs vLLM 0.34 or later (JobResult.deferred_release); "
                f"this is vLLM {VLLM_VERSION}"
            )
        self._load_timeout = None if load_timeout is None else float(load_timeout)
        self.namespace = namespace_for(
            offloading_spec.config, self._payload, namespace_extra, model_name
        )
        chain_config = secondary_chain_config(load_config(config), keep_host_tier=keep_host_tier)
        if chain_config.metrics.log_interval:
            adopt_vllm_logging(logging.getLogger("kvtier"))
        self._flat = primary_kv_view.cast("B")
        self._repair = ThreadPoolExecutor(1, thread_name_prefix="kvtier-vllm-repair")
        self._chain_config = chain_config
        self._job_workers = job_workers
        self._reopen_interval = float(reopen_interval)
        self._next_reopen = 0.0
        self._reopening = False
        # KV events (when vLLM's are on): what the chain stored and removed
        self._events: deque[Any] | None = (
            deque() if kv_events_enabled(offloading_spec) else None
        )
        self._long_keys: dict[bytes, bytes] = {}  # digest -> vLLM key, for events
        self.chain: Chain | _NoChain
        try:
            self.chain = self._open_chain()
        except OSError as exc:  # storage unreachable: serve as an empty tier, retry later
            log.warning(
                "kvtier: the chain of %s did not open (%s); vLLM runs without it and "
                "retries every %.0fs", config, exc, self._reopen_interval,
            )
            self.chain = _NoChain(repr(exc))
            self._next_reopen = time.monotonic() + self._reopen_interval
        except BaseException:
            self._repair.shutdown()
            self._flat.release()
            raise
        self._tier_names = [t.name for t in chain_config.tiers]
        self._lock = threading.RLock()  # a done-callback may run in the submitting thread
        self._probes: dict[bytes, _Probe] = {}
        self._batch: list[bytes] = []
        self._lookups: dict[int, list[tuple[bytes, _Probe]]] = {}
        self._jobs: dict[int, _Job] = {}
        # loads reported failed while still reading: chain job -> deferred_release
        self._late: dict[int, threading.Event] = {}
        self._repairs: set[Future[list[bool]]] = set()
        # keys whose load failed: a later store replaces the stored block
        self._damaged: dict[bytes, float] = {}
        self._finished: list[Any] = []
        self._next_prune = 0.0
        self._counts: dict[tuple[str, str], int] = {}  # since the last get_stats
        self._totals: dict[tuple[str, str], int] = {}
        self._reported: dict[str, dict[str, int]] = {}
        self._last_stats = 0.0
        self._activity = False
        self.closed = False
        _live.add(self)
        log.info(
            "kvtier tier %r: chain %s, namespace %s, %d-byte chunks",
            tier_type,
            " -> ".join(self._tier_names),
            self.namespace.hex,
            self._payload,
        )

    def _waiting_reads(self) -> bool:
        """Whether a request waits on this tier (a lookup or a load in flight)."""
        return bool(self._lookups) or any(job.load for job in self._jobs.values())

    def _open_chain(self) -> Chain:
        chain = Chain(self._chain_config, self.namespace, job_workers=self._job_workers)
        if self._events is not None:
            chain.add_listener(self._on_chain_event)
        return chain

    # KV events ---------------------------------------------------------------------
    def _on_chain_event(self, event: ChainEvent) -> None:
        """A chain's store or removal, as vLLM's ``OffloadingEvent`` (chain threads).

        vLLM sees the chain as one tier: a block is stored when vLLM's store
        lands in the chain (not again when it is copied between kvtier
        tiers), and removed when no kvtier tier holds it any more (a capacity
        victim demoted below, or still held above a lower tier that evicted
        it, stays).
        """
        assert self._events is not None
        keys = list(event.keys)
        if event.kind == "stored":
            if event.reason != "put":
                return
        else:
            chain = self.chain
            if not isinstance(chain, Chain):
                return
            try:
                where = chain.lookup(keys)
            except KvtierError:  # closing: nothing more to say
                return
            keys = [k for k, tier in zip(keys, where) if tier is None]
        keys = [self._long_keys.get(k, k) for k in keys]
        if keys:
            self._events.append(OffloadingEvent(
                keys=cast(Any, keys), medium=self.medium, removed=event.kind == "removed",
                locality=self.locality,
            ))

    def take_events(self) -> Iterable[Any]:
        """Blocks the chain stored and removed since the last call (vLLM's KV events)."""
        if self._events is None:
            return ()
        taken = []
        while self._events:
            taken.append(self._events.popleft())
        if taken:
            with self._lock:
                for e in taken:
                    self._count("kv_events", "removed" if e.removed else "stored", len(e.keys))
        return taken

    def _maybe_reopen_locked(self, now: float) -> None:
        """Try again to open a chain that failed to open, on a thread of its own."""
        if not isinstance(self.chain, _NoChain) or self._reopening or now < self._next_reopen:
            return
        self._reopening = True

        def run() -> None:
            try:
                chain: Chain | None = self._open_chain()
            except Exception as exc:
                log.debug("kvtier: reopening the chain failed: %r", exc)
                chain = None
            with self._lock:
                self._reopening = False
                self._next_reopen = time.monotonic() + self._reopen_interval
                if chain is not None and self.closed:
                    chain.close()
                elif chain is not None:
                    self._drain_locked(time.monotonic())  # the stand-in's last results
                    self.chain = chain
                    log.info("kvtier: chain %s opened", " -> ".join(self._tier_names))

        threading.Thread(target=run, name="kvtier-vllm-reopen", daemon=True).start()

    # lookups -------------------------------------------------------------------
    def lookup(self, key: bytes, req_context: ReqContext) -> Any:
        ck = chain_key(key)
        now = time.monotonic()
        with self._lock:
            self._drain_locked(now)
            probe = self._probes.get(ck)
            if probe is None or (probe.state >= _HIT and probe.expires <= now):
                self._probes[ck] = _Probe(_PENDING, now)
                self._batch.append(ck)
                return LookupResult.RETRY
            if probe.state == _HIT:
                self._count("lookup_keys", "hit")
                return LookupResult.HIT
            if probe.state == _MISS:
                self._count("lookup_keys", "miss")
                return LookupResult.MISS
            if now - probe.since > self._lookup_timeout:
                probe.state, probe.expires = _MISS, now + self._verdict_ttl
                self._count("lookup_keys", "timeout")
                return LookupResult.MISS
            return LookupResult.RETRY

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        with self._lock:
            waiting = self._waiting_reads()
        if waiting:
            _yield_gil()
        now = time.monotonic()
        with self._lock:
            self._drain_locked(now)
            self._maybe_reopen_locked(now)
            batch, self._batch = self._batch, []
            if now >= self._next_prune:
                self._prune_locked(now)
            if not batch or self.closed:
                return
            probes = [
                (k, p) for k in batch
                if (p := self._probes.get(k)) is not None and p.state == _PENDING
            ]
            if not probes:
                return
            for _, probe in probes:
                probe.state = _IN_FLIGHT
            try:
                job = self.chain.submit_lookup([k for k, _ in probes])
            except KvtierError as exc:  # closing: answer misses
                log.debug("kvtier lookup not submitted: %s", exc)
                for _, probe in probes:
                    probe.state, probe.expires = _MISS, now + self._verdict_ttl
                return
            self._lookups[job] = probes

    def _prune_locked(self, now: float) -> None:
        self._next_prune = now + max(1.0, self._verdict_ttl)
        stale = [
            k for k, p in self._probes.items()
            if (p.state >= _HIT and p.expires <= now)
            or (p.state == _PENDING and now - p.since > self._lookup_timeout)
        ]
        for k in stale:
            del self._probes[k]
        # a damaged key not stored again soon is left for a later process to replace
        old = [k for k, t in self._damaged.items() if now - t > self._failed_ttl]
        for k in old:
            del self._damaged[k]

    def _remember(self, keys: Iterable[bytes], state: int, ttl: float, now: float) -> None:
        for ck in keys:
            probe = self._probes.get(ck)
            if probe is None:
                self._probes[ck] = _Probe(state, now, now + ttl)
            else:
                probe.state, probe.expires = state, now + ttl

    # transfers -------------------------------------------------------------------
    def _rows(self, chunk_ids: Iterable[Any]) -> list[memoryview]:
        row, size, flat = self._row, self._payload, self._flat
        return [flat[int(c) * row : int(c) * row + size] for c in chunk_ids]

    def submit_store(self, job_metadata: TransferJob) -> None:
        now = time.monotonic()
        keys = list(job_metadata.keys)
        with self._lock:
            held = {
                ck for k in keys
                if (p := self._probes.get(ck := chain_key(k))) is not None
                and p.state == _HIT and p.expires > now
            }
            todo = [(k, c) for k, c in zip(keys, job_metadata.chunk_ids)
                    if chain_key(k) not in held]
            skipped = len(keys) - len(todo)
            if skipped:
                self._count("store_keys", "skipped", skipped)
            job = _Job(job_metadata.job_id, False, [k for k, _ in todo], now, skipped)
            if not todo:
                self._finish_locked(job, [], now)
                return
            chain_keys = [chain_key(k) for k, _ in todo]
            if self._events is not None:
                self._long_keys.update((ck, k) for (k, _), ck in zip(todo, chain_keys) if ck != k)
            rows = self._rows(c for _, c in todo)
            damaged = [ck for ck in chain_keys if self._damaged.pop(ck, None) is not None]
            if damaged and not self.closed:
                self._replace(job, damaged, chain_keys, rows)
                return
            self._submit_locked(job, lambda: self.chain.submit_put(chain_keys, rows), now)

    def submit_load(self, job_metadata: TransferJob) -> None:
        now = time.monotonic()
        keys = list(job_metadata.keys)
        with self._lock:
            job = _Job(job_metadata.job_id, True, keys, now)
            self._submit_locked(job, lambda: self.chain.submit_get(
                [chain_key(k) for k in keys], self._rows(job_metadata.chunk_ids)
            ), now)

    def _submit_locked(self, job: _Job, submit: Any, now: float) -> None:
        self._activity = True
        try:
            chain_job = submit()
        except KvtierError as exc:  # the chain is closing: the job fails, nothing was read
            log.debug("kvtier job %d not submitted: %s", job.vllm_id, exc)
            self._finish_locked(job, [False] * len(job.keys), now)
            return
        self._jobs[chain_job] = job

    def _replace(
        self, job: _Job, damaged: list[bytes], keys: list[bytes], rows: list[memoryview]
    ) -> None:
        """Store recomputed blocks over ones that failed to load, in that order.

        A tier drops a block its checks reject, but a load can also fail
        with the block left in place (a tier skipped while it was down), and
        a put of a key a tier holds is skipped as a duplicate; so the old
        block is evicted first, on a thread of this tier, then the new one
        is put.
        """

        def run() -> list[bool]:
            dropped = self.chain.evict(damaged)
            if dropped:
                with self._lock:
                    self._count("dropped_keys", "failed_load", dropped)
            return self.chain.put(keys, rows)

        def done(future: Future[list[bool]]) -> None:
            try:
                flags = future.result()
            except Exception as exc:  # a chain that closed under it: the store failed
                log.debug("kvtier: replacing %d block(s) failed: %r", len(damaged), exc)
                flags = []
            flags += [False] * (len(job.keys) - len(flags))
            with self._lock:
                self._repairs.discard(future)
                self._finish_locked(job, flags, time.monotonic())

        self._activity = True
        future = self._repair.submit(run)
        self._repairs.add(future)
        future.add_done_callback(done)

    def _finish_locked(
        self, job: _Job, flags: list[bool], now: float, late: threading.Event | None = None
    ) -> None:
        ok = [k for k, f in zip(job.keys, flags) if f]
        failed = [k for k, f in zip(job.keys, flags) if not f]
        kind = "load_keys" if job.load else "store_keys"
        if ok:
            self._count(kind, "ok", len(ok))
        if failed:
            self._count(kind, "failed", len(failed))
        # what this tier now holds, or failed to deliver, for later lookups and stores
        self._remember((chain_key(k) for k in ok), _HIT, self._verdict_ttl, now)
        if job.load and failed:
            gone = [chain_key(k) for k in failed]
            self._remember(gone, _MISS, self._failed_ttl, now)
            if late is None:  # a slow read is no sign of a damaged block
                self._damaged.update((ck, now) for ck in gone)
        success = not failed
        self._finished.append(
            job_result(
                job.vllm_id,
                success,
                ok if (job.load and ok and failed) else None,
                now - job.submitted,
                len(ok) * self._payload,
                late,
            )
        )

    def _drain_locked(self, now: float) -> None:
        for res in self.chain.poll():
            if res.error is not None:
                log.warning("kvtier %s job failed: %r", res.kind, res.error)
            if res.kind == "lookup":
                probes = self._lookups.pop(res.job_id, None)
                if probes is None:
                    continue
                where = res.result if res.error is None else [None] * len(probes)
                for (ck, probe), tier in zip(probes, where):
                    if self._probes.get(ck) is probe and probe.state == _IN_FLIGHT:
                        probe.state = _MISS if tier is None else _HIT
                        probe.expires = now + self._verdict_ttl
                continue
            job = self._jobs.pop(res.job_id, None)
            if job is None:
                released = self._late.pop(res.job_id, None)
                if released is not None:  # the read ended: vLLM may reuse its slots
                    released.set()
                continue
            flags = [bool(f) for f in res.result] if res.error is None else []
            flags += [False] * (len(job.keys) - len(flags))
            self._finish_locked(job, flags, now)
        if self._load_timeout is not None:
            self._fail_slow_loads_locked(now)

    def _fail_slow_loads_locked(self, now: float) -> None:
        """Report loads running past ``load_timeout`` as failed, release deferred."""
        assert self._load_timeout is not None
        slow = [
            chain_id for chain_id, job in self._jobs.items()
            if job.load and now - job.submitted > self._load_timeout
        ]
        for chain_id in slow:
            job = self._jobs.pop(chain_id)
            event = self._late[chain_id] = threading.Event()
            self._finish_locked(job, [False] * len(job.keys), now, event)

    def get_finished_jobs(self) -> Iterable[Any]:
        with self._lock:
            self._drain_locked(time.monotonic())
            done, self._finished = self._finished, []
            busy = self._waiting_reads()
        if busy:
            _yield_gil()
        return done

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._jobs or self._repairs or self._late)

    def drain_jobs(self) -> None:
        """Wait for every job; a load reported late has its release event set too."""
        with self._lock:
            ids = [*self._jobs, *self._late]
            repairs = list(self._repairs)
        if ids:
            self.chain.wait(ids)
        wait_futures(repairs)
        with self._lock:
            self._drain_locked(time.monotonic())

    # vLLM 0.33+: labels of vllm:kv_offload_config_info ---------------------------
    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return _CONFIG_INFO_KEYS

    def config_info(self) -> Mapping[str, str | int | float | bool]:
        """The chain's tiers, the namespace and the bytes of a chunk."""
        return {
            "kvtier_chain": " -> ".join(self._tier_names),
            "kvtier_namespace": self.namespace.hex,
            "kvtier_chunk_bytes": self._payload,
        }

    # requests ----------------------------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> Any:
        return RequestOffloadingContext()

    # lifecycle ---------------------------------------------------------------------
    def shutdown(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        try:
            self._repair.shutdown(wait=True)
            self.chain.close()  # finishes every submitted job first
        finally:
            with self._lock:
                self._drain_locked(time.monotonic())
                self._lookups.clear()
            self._flat.release()
            _live.discard(self)

    # stats -------------------------------------------------------------------------
    def _count(self, name: str, label: str, n: int = 1) -> None:
        key = (name, label)
        self._counts[key] = self._counts.get(key, 0) + n
        self._totals[key] = self._totals.get(key, 0) + n
        self._activity = True

    def chain_stats(self) -> dict[str, Any]:
        """The chain's :meth:`~kvtier.Chain.stats` (per kvtier tier counters)."""
        return self.chain.stats()

    def adapter_stats(self) -> dict[str, int]:
        """Adapter counters so far: ``"lookup_keys:hit"`` and so on."""
        with self._lock:
            return {f"{n}:{label}": v for (n, label), v in sorted(self._totals.items())}

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        defs: dict[str, OffloadingMetricMetadata] = {}
        for _, suffix, text in _TIER_COUNTERS:
            defs[METRIC_PREFIX + suffix] = OffloadingCounterMetadata(
                documentation=text, labelnames=_TIER_LABEL
            )
        defs[METRIC_PREFIX + _HEALTHY] = OffloadingGaugeMetadata(
            documentation="1 while a kvtier tier is in service, 0 while it is skipped.",
            labelnames=_TIER_LABEL,
        )
        for name, labels, text in _ADAPTER_COUNTERS:
            defs[METRIC_PREFIX + name] = OffloadingCounterMetadata(
                documentation=text, labelnames=labels
            )
        return defs

    def get_stats(self) -> Any:
        """What changed since the last call, as vLLM offloading stats (None if nothing)."""
        now = time.monotonic()
        with self._lock:
            if self.closed or (not self._activity and now - self._last_stats < 1.0):
                return None
            self._activity = False
            self._last_stats = now
            counts, self._counts = self._counts, {}
        stats = OffloadingConnectorStats()
        for (name, label), value in counts.items():
            stats.increase_counter(METRIC_PREFIX + name, value, (label,))
        try:
            snapshot = self.chain.stats()
        except KvtierError:
            snapshot = {"tiers": []}
        for tier in snapshot["tiers"]:
            name = str(tier["name"])
            seen = self._reported.setdefault(name, {})
            for key, suffix, _ in _TIER_COUNTERS:
                delta = int(tier.get(key, 0)) - seen.get(key, 0)
                if delta > 0:
                    stats.increase_counter(METRIC_PREFIX + suffix, delta, (name,))
                    seen[key] = int(tier.get(key, 0))
            stats.set_gauge(METRIC_PREFIX + _HEALTHY, 1.0 if tier.get("healthy") else 0.0, (name,))
        return None if stats.is_empty() else stats
