"""Tier chains: ordered tiers with promotion, demotion and write policies.

Reads go down the chain and stop at the first tier holding a key; a hit
below is promoted (copied up, asynchronously) into the tiers above that ask
for it.  Writes land in the first tier that accepts them; tiers below
receive them according to their write policy:

``through``
    written (asynchronously) as soon as the tier directly above has it;
``back``
    written when the tier above evicts it for capacity (demotion), so
    eviction loses nothing.

Backends are plain synchronous code; the chain runs asynchronous work on
per-tier worker threads, bounded by a per-tier backlog in bytes so a slow
tier slows writers down instead of filling memory.  A tier that raises is
skipped (its reads are misses) until its back-off expires.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, Literal, SupportsIndex

from kvtier.block import framing
from kvtier.block.namespace import Namespace
from kvtier.chain import catalog
from kvtier.chain.events import ChainListener, Listeners
from kvtier.chain.tier import Evicted, Tier
from kvtier.config.loader import ChainConfig, load_config
from kvtier.observe.metrics import MetricsReporter
from kvtier.plugins.registry import BackendRegistry, default_registry
from kvtier.spec import MAX_KEY_SIZE, BytesLike, ClosedError, CorruptBlockError

__all__ = ["Chain", "JobResult", "open_chain"]

log = logging.getLogger("kvtier.chain")

#: Bytes of asynchronous writes that may wait for one tier before writers block.
DEFAULT_BACKLOG_BYTES = 256 << 20


@dataclass(frozen=True)
class JobResult:
    """A finished asynchronous job.

    ``result`` is what the synchronous call would have returned; ``error``
    is set (and ``result`` empty) only if the chain itself failed, which
    backend faults never cause.
    """

    job_id: int
    kind: Literal["put", "get", "lookup"]
    result: list[Any]
    error: BaseException | None = None


class _Backlog:
    """Bytes of queued asynchronous writes for one tier."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = 0
        self.cond = threading.Condition()

    def acquire(self, nbytes: int, block: bool = True) -> bool:
        with self.cond:
            while self.pending and self.pending + nbytes > self.limit:
                if not block:
                    return False
                self.cond.wait()
            self.pending += nbytes
            return True

    def release(self, nbytes: int) -> None:
        with self.cond:
            self.pending -= nbytes
            self.cond.notify_all()


def _check_keys(keys: Sequence[bytes]) -> list[bytes]:
    out = list(keys)
    for key in out:
        if not isinstance(key, bytes):
            raise TypeError(f"keys must be bytes, got {type(key).__name__}")
        if not 0 < len(key) <= MAX_KEY_SIZE:
            raise ValueError(f"keys must be 1 to {MAX_KEY_SIZE} bytes long, got {len(key)}")
    return out


def _writable(buffers: Sequence[Any], n: int) -> list[memoryview]:
    if len(buffers) != n:
        raise ValueError(f"got {len(buffers)} output buffers for {n} keys")
    views = []
    for buf in buffers:
        view = memoryview(buf)
        if view.readonly:
            raise TypeError("output buffers must be writable (bytearray, numpy array, ...)")
        views.append(view.cast("B") if view.format != "B" or view.ndim != 1 else view)
    return views


class _DemotionSink(list[tuple[bytes, BytesLike]]):
    """An evicted list that registers each reported block as on its way to tier ``below``."""

    def __init__(self, chain: Chain, below: int) -> None:
        super().__init__()
        self._chain, self._below = chain, below

    def _register(self, items: Iterable[tuple[bytes, BytesLike]]) -> None:
        with self._chain._demoting_lock:
            for key, blob in items:
                self._chain._demoting[key] = (self._below, blob)

    def append(self, item: tuple[bytes, BytesLike]) -> None:
        self._register((item,))
        super().append(item)

    def insert(self, index: SupportsIndex, item: tuple[bytes, BytesLike]) -> None:
        self._register((item,))
        super().insert(index, item)

    def extend(self, items: Iterable[tuple[bytes, BytesLike]]) -> None:
        items = list(items)
        self._register(items)
        super().extend(items)

    def __iadd__(  # type: ignore[override, misc]
        self, items: Iterable[tuple[bytes, BytesLike]]
    ) -> _DemotionSink:
        self.extend(items)
        return self


class Chain:
    """An open tier chain.  Thread-safe; use :func:`open_chain` to make one."""

    def __init__(
        self,
        config: ChainConfig,
        namespace: Namespace,
        registry: BackendRegistry | None = None,
        *,
        job_workers: int = 4,
        backlog_bytes: int = DEFAULT_BACKLOG_BYTES,
    ) -> None:
        registry = registry or default_registry()
        self.config = config
        self.namespace = namespace
        self._ns = namespace.fingerprint
        self.tiers: list[Tier] = []
        try:
            for tier_config in config.tiers:
                tier = Tier(tier_config, registry.create(tier_config.backend), namespace)
                tier.open()
                self.tiers.append(tier)
                if tier.capabilities.persistent:
                    # so that operators' tools can say which model a namespace is
                    catalog.record(tier_config, registry, namespace)
        except BaseException:
            for tier in self.tiers:
                tier.close()
            raise
        self._writers = [
            ThreadPoolExecutor(t.config.workers, thread_name_prefix=f"kvtier-{t.name}")
            for t in self.tiers
        ]
        self._backlogs = [_Backlog(backlog_bytes) for _ in self.tiers]
        self._inflight = 0
        self._idle = threading.Condition()
        self._jobs = ThreadPoolExecutor(job_workers, thread_name_prefix="kvtier-job")
        self._job_ids = itertools.count(1)
        self._job_futures: dict[int, Future[None]] = {}
        self._done: list[JobResult] = []
        self._lock = threading.Lock()
        # blocks on their way down (demoted, or written through): readable meanwhile
        self._demoting: dict[bytes, tuple[int, BytesLike]] = {}
        self._demoting_lock = threading.Lock()
        # Per tier: keys it holds that the write-back tier below has not got
        # yet, for tiers that lose their blocks at close (RAM).  Close saves
        # them below, so write-back costs no block a write-through would keep.
        self._unsaved: list[set[bytes] | None] = [
            set() if self._keeps_unsaved(i) else None for i in range(len(self.tiers))
        ]
        self._listeners = Listeners()  # see add_listener
        self._closing = False  # no new jobs; running ones finish
        self._closed = False
        self._reporter: MetricsReporter | None = None
        if config.metrics.prometheus_port is not None or config.metrics.log_interval:
            try:
                self._reporter = MetricsReporter(self, config.metrics)
            except BaseException:
                self._shutdown()
                raise

    # context manager ------------------------------------------------------------
    def __enter__(self) -> Chain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("chain is closed")

    # writes -------------------------------------------------------------------
    def put(self, keys: Sequence[bytes], blocks: Sequence[BytesLike]) -> list[bool]:
        """Store ``blocks[i]`` under ``keys[i]``; True where some tier took it.

        The first tier stores synchronously (blocks it refuses fall through
        to the next); ``through`` tiers below receive copies asynchronously.
        The caller may reuse ``blocks`` as soon as this returns.
        """
        self._check_open()
        keys = _check_keys(keys)
        if len(blocks) != len(keys):
            raise ValueError(f"got {len(blocks)} blocks for {len(keys)} keys")
        payloads = [memoryview(b).cast("B") for b in blocks]
        result = [False] * len(keys)
        remaining = list(range(len(keys)))
        for index, tier in enumerate(self.tiers):
            if not remaining:
                break
            sub_keys = [keys[i] for i in remaining]
            flags, evicted, blobs = tier.put_payloads(
                sub_keys, [payloads[i] for i in remaining], self._evicted_sink(index)
            )
            stored = [(i, blob) for i, flag, blob in zip(remaining, flags, blobs) if flag]
            self._mark_unsaved(index, (keys[i] for i, _ in stored), True)
            self._handle_evicted(index, evicted)
            self._emit("stored", index, (keys[i] for i, _ in stored), "put")
            for i, _ in stored:
                result[i] = True
            if stored and self._writes_through(index):
                below = self.tiers[index + 1]
                self._submit_write(
                    index + 1,
                    [keys[i] for i, _ in stored],
                    [
                        blob
                        if blob is not None and below.codec == tier.codec
                        else framing.encode(self._ns, keys[i], payloads[i], below.codec)
                        for i, blob in stored
                    ],
                    "through",
                )
            remaining = [i for i, flag in zip(remaining, flags) if not flag]
        return result

    def _writes_through(self, index: int) -> bool:
        return index + 1 < len(self.tiers) and self.tiers[index + 1].config.write == "through"

    def _keeps_unsaved(self, index: int) -> bool:
        below = index + 1
        return (
            below < len(self.tiers)
            and self.tiers[below].config.write == "back"
            and not self.tiers[index].capabilities.persistent
        )

    def _mark_unsaved(self, index: int, keys: Iterable[bytes], unsaved: bool) -> None:
        held = self._unsaved[index]
        if held is None:
            return
        with self._demoting_lock:
            if unsaved:
                held.update(keys)
            else:
                held.difference_update(keys)

    def _save_unsaved(self) -> None:
        """At close: copy what RAM tiers hold and their write-back tiers lack down to them.

        Top down, so a block saved into a tier that is itself unsaved moves on.
        """
        for index, held in enumerate(self._unsaved):
            if not held:
                continue
            with self._demoting_lock:
                keys = list(held)
                held.clear()
            below = self.tiers[index + 1]
            for start in range(0, len(keys), 64):  # bounded memory: 64 blobs at a time
                part = keys[start : start + 64]
                found = self.tiers[index].get_blobs(part)
                pairs = [(k, b) for k, b in zip(part, found) if b is not None]
                if not pairs:
                    continue
                flags, evicted = below.put_blobs(
                    [k for k, _ in pairs], [b for _, b in pairs], self._evicted_sink(index + 1)
                )
                self._handle_evicted(index + 1, evicted)
                saved = [k for (k, _), flag in zip(pairs, flags) if flag]
                below.stats.add(demoted=len(saved))
                self._mark_unsaved(index + 1, saved, True)

    def _evicted_sink(self, index: int) -> Evicted:
        """The list a put into tier ``index`` reports its capacity victims in.

        Above a write-back tier, a victim becomes readable from the chain
        the moment the backend reports it, not when the put returns: by then
        the backend may long have dropped it, and a reader would find the
        block nowhere for the rest of the put.
        """
        below = index + 1
        if below < len(self.tiers) and self.tiers[below].config.write == "back":
            return _DemotionSink(self, below)
        return []

    def _handle_evicted(self, index: int, evicted: Evicted) -> None:
        if not evicted:
            return
        self._mark_unsaved(index, (k for k, _ in evicted), False)
        below = index + 1
        if below < len(self.tiers) and self.tiers[below].config.write == "back":
            with self._demoting_lock:
                for key, blob in evicted:
                    self._demoting[key] = (below, blob)
            self._submit_write(below, [k for k, _ in evicted], [b for _, b in evicted], "demote")
        self._emit("removed", index, (k for k, _ in evicted), "capacity")

    def _submit_write(
        self, index: int, keys: list[bytes], blobs: list[BytesLike], kind: str
    ) -> bool:
        """Queue framed blocks for tier ``index``; promotions never wait for room.

        A block written through stays readable from the queue until it lands,
        like a demotion: the tier above may evict it before then.
        """
        nbytes = sum(memoryview(b).nbytes for b in blobs)
        if not self._backlogs[index].acquire(nbytes, block=kind != "promote"):
            self.tiers[index].stats.add(dropped=len(keys))
            return False
        if kind == "through":
            with self._demoting_lock:
                for key, blob in zip(keys, blobs):
                    self._demoting[key] = (index, blob)
        with self._idle:
            self._inflight += 1
        try:
            self._writers[index].submit(self._write, index, keys, blobs, kind, nbytes)
        except RuntimeError:  # executor shut down: the chain is closing
            self._landed(index, keys, blobs, kind)
            self._write_done(index, nbytes)
            return False
        return True

    def _landed(self, index: int, keys: list[bytes], blobs: list[BytesLike], kind: str) -> None:
        """Forget blocks of a finished write that were readable while queued."""
        if kind not in ("demote", "through"):
            return
        with self._demoting_lock:
            for key, blob in zip(keys, blobs):
                if self._demoting.get(key, (index, None))[1] is blob:
                    del self._demoting[key]

    def _write(
        self, index: int, keys: list[bytes], blobs: list[BytesLike], kind: str, nbytes: int
    ) -> None:
        tier = self.tiers[index]
        try:
            flags, evicted = tier.put_blobs(keys, blobs, self._evicted_sink(index))
            self._handle_evicted(index, evicted)
            self._emit("stored", index, (k for k, f in zip(keys, flags) if f), kind)
            stored = sum(flags)
            if kind == "demote":
                tier.stats.add(demoted=stored)
            elif kind == "promote":
                tier.stats.add(promoted=stored)
            if stored < len(flags) and not tier.healthy:
                tier.stats.add(dropped=len(flags) - stored)
            if kind != "promote" and stored and self._writes_through(index):
                pairs = [(k, b) for k, b, f in zip(keys, blobs, flags) if f]
                self._submit_write(
                    index + 1, [k for k, _ in pairs], [b for _, b in pairs], "through"
                )
        except Exception:  # a bug here must not kill the worker silently
            log.exception("kvtier: asynchronous %s write to tier %r failed", kind, tier.name)
        finally:
            self._landed(index, keys, blobs, kind)
            self._write_done(index, nbytes)

    def _demotions_of(self, keys: Sequence[bytes]) -> dict[bytes, tuple[int, BytesLike]]:
        """Pending demotions of ``keys``, taken before a read looks at the tiers.

        A demotion that lands while the read walks the tiers has left this
        map by the time the walk ends; the copy taken first still has it.
        """
        with self._demoting_lock:
            if not self._demoting:
                return {}
            return {k: self._demoting[k] for k in keys if k in self._demoting}

    def _pending_demotion(
        self, key: bytes, early: dict[bytes, tuple[int, BytesLike]]
    ) -> tuple[int, BytesLike] | None:
        with self._demoting_lock:
            return self._demoting.get(key) or early.get(key)

    def _read_demoting(
        self, key: bytes, out: memoryview | None, early: dict[bytes, tuple[int, BytesLike]]
    ) -> bytes | bool:
        """Serve a block evicted from a tier whose demotion has not landed yet."""
        pending = self._pending_demotion(key, early)
        if pending is None:
            return False
        index, blob = pending
        tier = self.tiers[index]
        try:
            if out is None:
                raw_len = framing.parse_header(blob, self._ns, key).raw_len
                buffer = bytearray(raw_len)
                framing.decode_into(blob, self._ns, key, memoryview(buffer), verify=tier.verify)
                tier.stats.add(hits=1, bytes_out=raw_len)
                return bytes(buffer)
            framing.decode_into(blob, self._ns, key, out, verify=tier.verify)
        except CorruptBlockError:
            tier.stats.add(corrupt=1)
            return False
        tier.stats.add(hits=1, bytes_out=out.nbytes)
        return True

    def _write_done(self, index: int, nbytes: int) -> None:
        self._backlogs[index].release(nbytes)
        with self._idle:
            self._inflight -= 1
            if not self._inflight:
                self._idle.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued asynchronous write (through, demotion, promotion) is done."""
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout)

    # reads --------------------------------------------------------------------
    def get(self, keys: Sequence[bytes], out: Sequence[Any]) -> list[bool]:
        """Fill ``out[i]`` (a writable buffer of the block's size) with block ``keys[i]``.

        Returns True where the block was found and checked.  Where it is
        False the content of ``out[i]`` is unspecified.  Hits below the first
        tier are promoted asynchronously.
        """
        self._check_open()
        keys = _check_keys(keys)
        early = self._demotions_of(keys)
        outs = _writable(out, len(keys))
        found = [False] * len(keys)
        remaining = list(range(len(keys)))
        for index, tier in enumerate(self.tiers):
            if not remaining:
                break
            flags = tier.get_into([keys[i] for i in remaining], [outs[i] for i in remaining])
            hits = [i for i, flag in zip(remaining, flags) if flag]
            for i in hits:
                found[i] = True
            if hits and index:
                self._promote(index, [keys[i] for i in hits], [outs[i] for i in hits])
            remaining = [i for i, flag in zip(remaining, flags) if not flag]
        for i in remaining:
            found[i] = self._read_demoting(keys[i], outs[i], early) is True
        return found

    def get_bytes(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Blocks as new ``bytes`` objects, for callers that do not know their sizes.

        Costs one copy more than :meth:`get`; hits below the first tier are
        promoted the same way.
        """
        self._check_open()
        keys = _check_keys(keys)
        early = self._demotions_of(keys)
        found: list[bytes | None] = [None] * len(keys)
        remaining = list(range(len(keys)))
        for index, tier in enumerate(self.tiers):
            if not remaining:
                break
            payloads = tier.get_payloads([keys[i] for i in remaining])
            hits = [(i, p) for i, p in zip(remaining, payloads) if p is not None]
            for i, payload in hits:
                found[i] = payload
            if hits and index:
                self._promote(index, [keys[i] for i, _ in hits], [memoryview(p) for _, p in hits])
            remaining = [i for i, p in zip(remaining, payloads) if p is None]
        for i in remaining:
            pending = self._read_demoting(keys[i], None, early)
            found[i] = pending if isinstance(pending, bytes) else None
        return found

    def get_blobs(self, keys: Sequence[bytes]) -> list[BytesLike | None]:
        """Framed blocks exactly as stored (header checked), for serving them on.

        Used by ``kvtier serve``: the receiving side checks them again.
        """
        self._check_open()
        keys = _check_keys(keys)
        early = self._demotions_of(keys)
        found: list[BytesLike | None] = [None] * len(keys)
        remaining = list(range(len(keys)))
        for index, tier in enumerate(self.tiers):
            if not remaining:
                break
            blobs = tier.get_blobs([keys[i] for i in remaining])
            hits = [(i, b) for i, b in zip(remaining, blobs) if b is not None]
            for i, blob in hits:
                found[i] = blob
            tier.stats.add(hits=len(hits), misses=len(remaining) - len(hits))
            targets = self._promotion_targets(index) if hits else []
            if targets:
                hit_keys = [keys[i] for i, _ in hits]
                owned: list[BytesLike] = [bytes(b) for _, b in hits]  # one copy for all targets
                for upper in targets:
                    self._submit_write(upper, hit_keys, owned, "promote")
            remaining = [i for i, b in zip(remaining, blobs) if b is None]
        for i in remaining:
            pending = self._pending_demotion(keys[i], early)
            if pending is not None:
                found[i] = pending[1]
        return found

    def put_blobs(self, keys: Sequence[bytes], blobs: Sequence[BytesLike]) -> list[bool]:
        """Store framed blocks (made by another chain of the same namespace).

        Each blob's header must match this chain's namespace and the key, or
        it is refused (False).  Tiers below follow their write policies.
        """
        self._check_open()
        keys = _check_keys(keys)
        if len(blobs) != len(keys):
            raise ValueError(f"got {len(blobs)} blocks for {len(keys)} keys")
        result = [False] * len(keys)
        remaining = list(range(len(keys)))
        for index, tier in enumerate(self.tiers):
            if not remaining:
                break
            flags, evicted = tier.put_blobs(
                [keys[i] for i in remaining], [blobs[i] for i in remaining],
                self._evicted_sink(index),
            )
            stored = [i for i, flag in zip(remaining, flags) if flag]
            self._mark_unsaved(index, (keys[i] for i in stored), True)
            self._handle_evicted(index, evicted)
            self._emit("stored", index, (keys[i] for i in stored), "put")
            for i in stored:
                result[i] = True
            if stored and self._writes_through(index):
                self._submit_write(
                    index + 1,
                    [keys[i] for i in stored],
                    [bytes(blobs[i]) for i in stored],
                    "through",
                )
            remaining = [i for i, flag in zip(remaining, flags) if not flag]
        return result

    def _promotion_targets(self, source: int) -> list[int]:
        """Tiers above ``source`` that take copies of its hits now."""
        return [i for i in range(source) if self.tiers[i].config.promote and self.tiers[i].healthy]

    def _promote(self, source: int, keys: list[bytes], payloads: list[memoryview]) -> None:
        for index in self._promotion_targets(source):
            codec = self.tiers[index].codec
            blobs: list[BytesLike] = [
                framing.encode(self._ns, k, p, codec) for k, p in zip(keys, payloads)
            ]
            self._submit_write(index, keys, blobs, "promote")

    def lookup(self, keys: Sequence[bytes]) -> list[int | None]:
        """Per key, the index of the first tier holding it, or None."""
        self._check_open()
        keys = _check_keys(keys)
        early = self._demotions_of(keys)
        where: list[int | None] = [None] * len(keys)
        remaining = list(range(len(keys)))
        for index, tier in enumerate(self.tiers):
            if not remaining:
                break
            flags = tier.lookup([keys[i] for i in remaining])
            for i, flag in zip(remaining, flags):
                if flag:
                    where[i] = index
            remaining = [i for i, flag in zip(remaining, flags) if not flag]
        for i in remaining:
            pending = self._pending_demotion(keys[i], early)
            if pending is not None:
                where[i] = pending[0]
        return where

    def prefix_hits(self, keys: Sequence[bytes]) -> int:
        """How many leading keys some tier holds (a prompt prefix's reusable blocks)."""
        where = self.lookup(keys)
        for count, tier_index in enumerate(where):
            if tier_index is None:
                return count
        return len(where)

    def evict(self, keys: Sequence[bytes]) -> int:
        """Remove keys from every tier; returns how many were held somewhere.

        Queued asynchronous writes finish first, so none brings a key back.
        """
        self._check_open()
        keys = _check_keys(keys)
        self.flush()
        removed = [False] * len(keys)
        for index, tier in enumerate(self.tiers):
            self._mark_unsaved(index, keys, False)
            flags = tier.evict(keys)
            for i, flag in enumerate(flags):
                removed[i] = removed[i] or flag
            self._emit("removed", index, (k for k, f in zip(keys, flags) if f), "evict")
        return sum(removed)

    # events -----------------------------------------------------------------------
    def add_listener(self, listener: ChainListener) -> None:
        """Call ``listener`` with a :class:`~kvtier.chain.events.ChainEvent` for every
        batch of blocks a tier of this chain stores or removes (see that module)."""
        self._listeners.add(listener)

    def remove_listener(self, listener: ChainListener) -> None:
        """Stop calling ``listener`` (a no-op if it was not added)."""
        self._listeners.remove(listener)

    def report_removed(self, tier_index: int, keys: Sequence[bytes], reason: str) -> None:
        """Tell listeners that blocks left tier ``tier_index`` by a path outside the
        chain's own calls (an operator's purge or scrub working on the backends)."""
        self._emit("removed", tier_index, keys, reason)

    def _emit(
        self, kind: Literal["stored", "removed"], index: int, keys: Iterable[bytes], reason: str
    ) -> None:
        if self._listeners:
            self._listeners.emit(kind, self.tiers[index].name, index, keys, reason)

    # asynchronous surface -------------------------------------------------------
    def _submit(self, kind: Literal["put", "get", "lookup"], fn: Any, *args: Any) -> int:
        if self._closing:
            raise ClosedError("chain is closed")
        job_id = next(self._job_ids)

        def run() -> None:
            try:
                res = JobResult(job_id, kind, list(fn(*args)))
            except BaseException as exc:
                res = JobResult(job_id, kind, [], exc)
            with self._lock:
                self._done.append(res)
                self._job_futures.pop(job_id, None)

        with self._lock:
            self._job_futures[job_id] = self._jobs.submit(run)
        return job_id

    def submit_put(self, keys: Sequence[bytes], blocks: Sequence[BytesLike]) -> int:
        """Start a put; returns a job id at once.  Keep ``blocks`` intact until it finishes."""
        return self._submit("put", self.put, list(keys), list(blocks))

    def submit_get(self, keys: Sequence[bytes], out: Sequence[Any]) -> int:
        """Start a get into ``out``; returns a job id at once."""
        return self._submit("get", self.get, list(keys), list(out))

    def submit_lookup(self, keys: Sequence[bytes]) -> int:
        """Start a lookup; the job's result is :meth:`lookup`'s answer."""
        return self._submit("lookup", self.lookup, list(keys))

    def poll(self) -> list[JobResult]:
        """Jobs finished since the last poll (each reported once)."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def wait(self, job_ids: Iterable[int] | None = None, timeout: float | None = None) -> bool:
        """Wait for the given jobs (default: all running ones); True if all finished."""
        with self._lock:
            if job_ids is None:
                futures = list(self._job_futures.values())
            else:
                futures = [f for j in job_ids if (f := self._job_futures.get(j)) is not None]
        _, not_done = wait_futures(futures, timeout)
        return not not_done

    # introspection and lifecycle ------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per-tier counters, latency, health and backend figures."""
        return {
            "namespace": self.namespace.hex,
            "tiers": [tier.snapshot() for tier in self.tiers],
            "pending_writes": self._inflight,
        }

    def close(self) -> None:
        """Finish queued work and close every tier.  Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        if self._reporter is not None:
            self._reporter.stop(self)
        self._shutdown()

    def _shutdown(self) -> None:
        self._jobs.shutdown(wait=True)
        self.flush()
        try:
            self._save_unsaved()
        except Exception:  # closing must go on: the tiers still need closing
            log.exception("kvtier: saving write-back blocks at close failed")
        self.flush()
        self._closed = True
        for writer in self._writers:
            writer.shutdown(wait=True)
        for tier in self.tiers:
            try:
                tier.close()
            except Exception:
                log.exception("kvtier: closing tier %r failed", tier.name)


def open_chain(
    config: str | os.PathLike[str] | Mapping[str, Any] | ChainConfig,
    namespace: Namespace | str | Mapping[str, Any],
    *,
    registry: BackendRegistry | None = None,
    **options: Any,
) -> Chain:
    """Open the tier chain described by ``config`` (a YAML path, a dict, or a loaded config).

    ``namespace`` identifies the KV cache (see :class:`~kvtier.Namespace`);
    a plain string is taken as the model name.  Extra keyword options go to
    :class:`Chain` (``job_workers``, ``backlog_bytes``).
    """
    if not isinstance(config, ChainConfig):
        config = load_config(config, registry=registry)
    return Chain(config, Namespace.of(namespace), registry, **options)
