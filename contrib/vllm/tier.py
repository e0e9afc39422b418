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
    copy.  Keys this tier knows it holds are not stored again.  A job naming
    a chunk outside the primary region fails whole, before any I/O.
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
after a back-off); so is one whose storage is unreachable when vLLM starts:
the chain opens with that tier failed, its other tiers serve, and the tier
is opened in the background once it can be (:mod:`kvtier.chain.health`).
A chain that fails to open as a whole (a ``required`` tier down) leaves
this tier empty until a later attempt (every ``reopen_interval`` seconds)
opens it.  No storage fault reaches vLLM as an exception.

Keys and namespace (:mod:`.keys`).  vLLM's ``OffloadKey`` is used as
the kvtier key (its digest when over a kvtier key's 64 bytes), and every block
is stored under a :class:`kvtier.Namespace` made from vLLM's offloading config
(model, KV dtype, row and parallel layout, vLLM release): blocks from any
other configuration are misses.  ``namespace_extra`` adds fields of your own.

Tenants (:mod:`.tenancy`).  Each request's lookups, loads and stores go to
the chain of its tenant, read from ``kv_transfer_params["kvtier"]["tenant"]``
(or the configured ``tenant``); ``chain`` is the configured tenant's.

KV events (:mod:`.kv_events`): what vLLM stored in the chains, and what they
no longer hold, through ``take_events`` when vLLM's KV events are on.

Stats (:mod:`.tier_metrics`).  vLLM's metric hooks work in 0.32: the tier
declares counters (``vllm:kv_offload_kvtier_*``) and reports what changed, on
vLLM's ``/metrics`` and in ``LLM.get_metrics()`` when stats logging is on.  The
chain's own ``metrics:`` section works as well; its log line goes to vLLM's
log handlers.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, ClassVar

from kvtier.chain import Chain
from kvtier.config import load_config
from kvtier.spec import KvtierError

from ._compat import (
    LookupResult,
    Medium,
    OffloadingMetricMetadata,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    SecondaryTierManager,
    TransferJob,
    adopt_vllm_logging,
    job_result,
    kv_events_enabled,
    row_payload_bytes,
)
from .args import secondary_chain_config
from .chain_like import ChainLike, UnopenedChain
from .hints import retention
from .keep_prefixes import prefix_keeper
from .keys import chain_key, namespace_for
from .kv_events import ChainEvents
from .lookups import HIT, MISS, LookupVerdicts
from .recompute_timing import RecomputeTimer
from .region import PrimaryRows
from .tenancy import TenantRouting, qualified_key
from .tier_metrics import METRIC_PREFIX, AdapterCounters, metric_definitions, offloading_stats
from .tier_options import TierOptions
from .yielding import StepYield

# chain_key, namespace_for and METRIC_PREFIX were first defined here; they stay importable
__all__ = ["METRIC_PREFIX", "KvtierTier", "chain_key", "live_tiers", "namespace_for"]

log = logging.getLogger("kvtier.vllm")

_CONFIG_INFO_KEYS = ("kvtier_chain", "kvtier_namespace", "kvtier_chunk_bytes")

_live: weakref.WeakSet[KvtierTier] = weakref.WeakSet()


def live_tiers() -> list[KvtierTier]:
    """The open ``KvtierTier`` instances of this process (for in-process inspection)."""
    return [t for t in list(_live) if not t.closed]


@dataclass
class _Job:
    vllm_id: int
    load: bool
    keys: Sequence[bytes]  # vLLM keys, in the order given to the chain
    submitted: float
    skipped: int = 0
    tenant: str = ""


class KvtierTier(SecondaryTierManager):  # type: ignore[misc, unused-ignore]
    """A kvtier chain as a vLLM secondary tier (see the module docstring).

    Keyword arguments, from the ``secondary_tiers`` entry: ``config`` (the
    kvtier YAML, required) and the options documented on
    :class:`~kvtier.contrib.vllm.tier_options.TierOptions`.
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
        tenant: str = "default",
        trust_client_tenant: bool = True,
        shared_tenants: list[str] | None = None, keep_prefixes: list[Any] | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self._options = options = TierOptions.checked(
            tier_type, config=config, namespace_extra=namespace_extra, model_name=model_name,
            keep_host_tier=keep_host_tier, lookup_timeout=lookup_timeout, verdict_ttl=verdict_ttl,
            failed_ttl=failed_ttl, job_workers=job_workers, keep_prefixes=keep_prefixes,
            reopen_interval=reopen_interval, locality=locality, load_timeout=load_timeout,
            tenant=tenant, trust_client_tenant=trust_client_tenant, shared_tenants=shared_tenants,
        )
        if options.locality is not None:  # unset: vLLM's default stays
            self.locality = options.locality
        self._row = int(self.block_size_bytes)
        self._payload = row_payload_bytes(offloading_spec, self._row)
        self.namespace = namespace_for(
            offloading_spec.config, self._payload, options.namespace_extra, options.model_name
        ).for_tenant(options.tenant)
        self._chain_config = secondary_chain_config(
            load_config(options.config), keep_host_tier=options.keep_host_tier
        )
        if self._chain_config.metrics.log_interval:
            adopt_vllm_logging(logging.getLogger("kvtier"))
        self._tier_names = [t.name for t in self._chain_config.tiers]
        # KV events (when vLLM's are on): what the chain stored and removed
        self._events = (ChainEvents(self.medium, self.locality)
                        if kv_events_enabled(offloading_spec) else None)
        self._region = PrimaryRows(primary_kv_view, self._row, self._payload)
        self._repair = ThreadPoolExecutor(1, thread_name_prefix="kvtier-vllm-repair")
        self._next_reopen = 0.0
        self._reopening = False
        try:
            self._tenancy = TenantRouting(
                self._chain_config, self.namespace, lambda: self.chain,
                trust_client_tenant=options.trust_client_tenant,
                shared=options.shared_tenants, job_workers=options.job_workers,
                retry_after=options.reopen_interval, on_open=self._listen,
            )
            self.chain: ChainLike = self._open_first_chain()
        except BaseException:
            self._repair.shutdown()
            self._region.release()
            raise
        self._init_state()
        self._keeper = prefix_keeper(  # kv_hints (.hints), named prefixes (.keep_prefixes)
            self._tenancy.chain_of, self._lock, options, offloading_spec, lambda: self._repairs)
        _live.add(self)
        log.info("kvtier tier %r: chain %s, namespace %s, %d-byte chunks", tier_type,
                 " -> ".join(self._tier_names), self.namespace.hex, self._payload)

    def _init_state(self) -> None:
        """What the tier keeps between calls, all guarded by ``_lock``."""
        # reentrant: a done-callback may run in the submitting thread
        self._lock = threading.RLock()
        self._counters = AdapterCounters()
        self._verdicts = LookupVerdicts(
            self._options.lookup_timeout, self._options.verdict_ttl, self._counters
        )
        self._jobs: dict[int, _Job] = {}
        self._timer = RecomputeTimer(self.namespace, self._offloading_spec)  # teaches the chain
        self._step_yield = StepYield()
        # loads reported failed while still reading: chain job -> deferred_release
        self._late: dict[int, threading.Event] = {}
        self._repairs: set[Future[list[bool]]] = set()
        # keys whose load failed: a later store replaces the stored block
        self._damaged: dict[bytes, float] = {}
        self._finished: list[Any] = []
        self._next_prune = 0.0
        # per kvtier tier, the chain counters get_stats already reported
        self._reported: dict[str, dict[str, int]] = {}
        self.closed = False

    def _waiting_reads(self) -> bool:
        """Whether a request waits on this tier (a lookup or a load in flight)."""
        return self._verdicts.waiting or any(job.load for job in self._jobs.values())

    def _wait_reads(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the loads and lookups in flight to land."""
        with self._lock:
            ids = [i for i, job in self._jobs.items() if job.load] + self._verdicts.in_flight()
        if ids:  # returns once they landed: the loop polls them at once
            self._tenancy.router.wait(ids, timeout)

    # the chain -----------------------------------------------------------------------
    def _open_chain(self) -> Chain:
        return self._tenancy.open_own()  # one of the tenants' chains, listened to

    def _listen(self, chain: Chain) -> None:
        if self._events is not None:
            self._events.listen(chain)

    def _open_first_chain(self) -> ChainLike:
        """The chain, or a stand-in while its storage is unreachable (reopened later)."""
        try:
            return self._open_chain()
        except OSError as exc:  # storage unreachable: serve as an empty tier, retry later
            log.warning(
                "kvtier: the chain of %s did not open (%s); vLLM runs without it and "
                "retries every %.0fs", self._options.config, exc, self._options.reopen_interval,
            )
            self._next_reopen = time.monotonic() + self._options.reopen_interval
            return UnopenedChain(repr(exc))

    def _maybe_reopen_locked(self, now: float) -> None:
        """Try again to open a chain that failed to open, on a thread of its own."""
        if not isinstance(self.chain, UnopenedChain) or self._reopening or now < self._next_reopen:
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
                self._next_reopen = time.monotonic() + self._options.reopen_interval
                if chain is not None and self.closed:
                    chain.close()
                elif chain is not None:
                    self._drain_locked(time.monotonic())  # the stand-in's last results
                    self.chain = chain
                    log.info("kvtier: chain %s opened", " -> ".join(self._tier_names))

        threading.Thread(target=run, name="kvtier-vllm-reopen", daemon=True).start()

    # KV events -----------------------------------------------------------------------
    def take_events(self) -> Iterable[Any]:
        """Blocks the chain stored and removed since the last call (vLLM's KV events)."""
        taken = [] if self._events is None else self._events.take()
        if taken:
            with self._lock:
                for e in taken:
                    kind = "removed" if e.removed else "stored"
                    self._counters.count("kv_events", kind, len(e.keys))
        return taken

    # lookups -------------------------------------------------------------------------
    def lookup(self, key: bytes, req_context: ReqContext) -> Any:
        now = time.monotonic()
        with self._lock:
            self._drain_locked(now)
            tenant = self._tenancy.of(req_context, self._counters)
            if tenant is None:  # a bad tenant name: a miss (logged once)
                answer = LookupResult.MISS
            else:
                answer = self._verdicts.answer(qualified_key(tenant, key), now)
            return self._timer.looked_up(self.chain, req_context, answer, now)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        with self._lock:
            waiting = self._waiting_reads()
        if waiting:
            self._step_yield(self._wait_reads)  # .yielding: let the reads run; wait if idle
        now = time.monotonic()
        with self._lock:
            self._timer.step()  # what this step scheduled is computed after it
            self._drain_locked(now)
            self._maybe_reopen_locked(now)
            if now >= self._next_prune:
                self._prune_locked(now)
            batch = self._verdicts.take_queued()
            if batch and not self.closed:
                self._verdicts.submit(self._tenancy.router, batch, now)

    def _prune_locked(self, now: float) -> None:
        self._next_prune = now + max(1.0, self._options.verdict_ttl)
        self._verdicts.prune(now)
        # a damaged key not stored again soon is left for a later process to replace
        old = [k for k, t in self._damaged.items() if now - t > self._options.failed_ttl]
        for k in old:
            del self._damaged[k]

    # transfers -----------------------------------------------------------------------
    def _chunks_fit(self, job_metadata: TransferJob, keys: list[Any]) -> bool:
        """Whether the job names one chunk of the region per key (if not, it fails whole)."""
        if self._region.fit(job_metadata.chunk_ids, len(keys)):
            return True
        log.warning("kvtier job %d refused: %d key(s), chunk ids %s, the primary region has "
                    "%d chunks", job_metadata.job_id, len(keys),
                    list(job_metadata.chunk_ids)[:8], self._region.count)
        return False

    def submit_store(self, job_metadata: TransferJob) -> None:
        now = time.monotonic()
        keys = list(job_metadata.keys)
        with self._lock:
            self._timer.stored(self.chain, job_metadata, len(keys), now)  # what computing took
            tenant = self._tenancy.of(job_metadata.req_context, self._counters)
            if tenant is None or not self._chunks_fit(job_metadata, keys):
                self._refuse_locked(_Job(job_metadata.job_id, False, keys, now))
                return
            if hinted := retention(job_metadata.req_context):  # once the stores are done
                self._keeper.submit(tenant, [chain_key(k) for k in keys], hinted)
            held = {qk for k in keys if self._verdicts.holds(qk := qualified_key(tenant, k), now)}
            todo = [(k, c) for k, c in zip(keys, job_metadata.chunk_ids)
                    if qualified_key(tenant, k) not in held]
            skipped = len(keys) - len(todo)
            if skipped:
                self._counters.count("store_keys", "skipped", skipped)
            job = _Job(job_metadata.job_id, False, [k for k, _ in todo], now, skipped, tenant)
            if not todo:
                self._finish_locked(job, [], now)
                return
            chain_keys = [qualified_key(tenant, k) for k, _ in todo]
            if self._events is not None:
                self._events.long_keys.update(
                    (ck, k) for k, _ in todo if (ck := chain_key(k)) != k)
            rows = self._region.rows(c for _, c in todo)
            damaged = [ck for ck in chain_keys if self._damaged.pop(ck, None) is not None]
            if damaged and not self.closed:
                self._replace(job, damaged, chain_keys, rows)
                return
            # vLLM holds a chunk being stored (its ref_cnt) until the job is done
            self._submit_locked(
                job, lambda: self._tenancy.router.submit_put(chain_keys, rows, held=True), now
            )

    def submit_load(self, job_metadata: TransferJob) -> None:
        now = time.monotonic()
        keys = list(job_metadata.keys)
        with self._lock:
            tenant = self._tenancy.of(job_metadata.req_context, self._counters)
            job = _Job(job_metadata.job_id, True, keys, now, tenant=tenant or "")
            if tenant is None or not self._chunks_fit(job_metadata, keys):
                self._refuse_locked(job)
                return
            self._submit_locked(job, lambda: self._tenancy.router.submit_get(
                [qualified_key(tenant, k) for k in keys], self._region.rows(job_metadata.chunk_ids)
            ), now)

    def _submit_locked(self, job: _Job, submit: Any, now: float) -> None:
        self._counters.active = True
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
            dropped = self._tenancy.router.evict(damaged)
            if dropped:
                with self._lock:
                    self._counters.count("dropped_keys", "failed_load", dropped)
            return self._tenancy.router.put(keys, rows)

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

        self._counters.active = True
        future = self._repair.submit(run)
        self._repairs.add(future)
        future.add_done_callback(done)

    def _refuse_locked(self, job: _Job) -> None:
        """Report a job failed that touched no storage (its stored blocks stay as they are)."""
        if job.keys:
            self._counters.count("load_keys" if job.load else "store_keys", "failed",
                                 len(job.keys))
        self._finished.append(job_result(job.vllm_id, False, None, 0.0, 0))

    def _finish_locked(
        self, job: _Job, flags: list[bool], now: float, late: threading.Event | None = None
    ) -> None:
        ok = [k for k, f in zip(job.keys, flags) if f]
        failed = [k for k, f in zip(job.keys, flags) if not f]
        kind = "load_keys" if job.load else "store_keys"
        if ok:
            self._counters.count(kind, "ok", len(ok))
            self._keeper.done(job.tenant, ok, job.load)  # named prefixes' blocks: kept
        if failed:
            self._counters.count(kind, "failed", len(failed))
        # what this tier now holds, or failed to deliver, for later lookups and stores
        self._verdicts.remember((qualified_key(job.tenant, k) for k in ok), HIT,
                                self._options.verdict_ttl, now)
        if job.load and failed:
            gone = [qualified_key(job.tenant, k) for k in failed]
            self._verdicts.remember(gone, MISS, self._options.failed_ttl, now)
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
        for res in self._tenancy.router.poll():
            if res.error is not None:
                log.warning("kvtier %s job failed: %r", res.kind, res.error)
            if res.kind == "lookup":
                self._verdicts.answered(
                    res.job_id, res.result if res.error is None else None, now, self.chain
                )
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
        if self._options.load_timeout is not None:
            self._fail_slow_loads_locked(now, self._options.load_timeout)

    def _fail_slow_loads_locked(self, now: float, load_timeout: float) -> None:
        """Report loads running past ``load_timeout`` as failed, release deferred."""
        slow = [
            chain_id for chain_id, job in self._jobs.items()
            if job.load and now - job.submitted > load_timeout
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
            StepYield.once()
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
            self._tenancy.router.wait(ids)
        wait_futures(repairs)
        with self._lock:
            self._drain_locked(time.monotonic())

    # vLLM 0.33+: labels of vllm:kv_offload_config_info -------------------------------
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

    # requests ------------------------------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> Any:
        return RequestOffloadingContext()

    # lifecycle -----------------------------------------------------------------------
    def shutdown(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        try:
            self._repair.shutdown(wait=True)
            self._keeper.close()
            self._tenancy.close()  # the other tenants' chains, each finishing its jobs
            self.chain.close()  # finishes every submitted job first
        finally:
            with self._lock:
                self._drain_locked(time.monotonic())
                self._verdicts.drop_in_flight()
            self._region.release()
            _live.discard(self)

    # stats ---------------------------------------------------------------------------
    def chain_stats(self) -> dict[str, Any]:
        """The chain's :meth:`~kvtier.Chain.stats` (per kvtier tier counters)."""
        return self.chain.stats()

    def tenant_stats(self) -> dict[str, dict[str, Any]]:
        """Per tenant whose chain is open, that chain's :meth:`~kvtier.Chain.stats`."""
        return {t: chain.stats() for t in self._tenancy.opened()
                if (chain := self._tenancy.chain_of(t)) is not None}

    def adapter_stats(self) -> dict[str, int]:
        """Adapter counters so far: ``"lookup_keys:hit"`` and so on."""
        with self._lock:
            return self._counters.totals()

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        return metric_definitions()

    def get_stats(self) -> Any:
        """What changed since the last call, as vLLM offloading stats (None if nothing)."""
        now = time.monotonic()
        with self._lock:
            counts = None if self.closed else self._counters.take(now)
        if counts is None:
            return None
        try:
            snapshot = self.chain.stats()
        except KvtierError:
            snapshot = {"tiers": []}
        return offloading_stats(counts, snapshot, self._reported)
