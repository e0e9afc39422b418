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
per-tier worker threads (:mod:`kvtier.chain.traffic`).  A tier that raises
is skipped (its reads are misses) until its back-off expires.

This module is the walk that serves callers' reads and writes; the copies
it starts between tiers (through, demotion, promotion, RAM tiers saved at
close) are the traffic's.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from time import perf_counter
from typing import Any, Literal

from kvtier.block import framing
from kvtier.block.buffers import joined
from kvtier.block.namespace import Namespace
from kvtier.chain import catalog
from kvtier.chain.arguments import byte_views, check_keys, writable
from kvtier.chain.cost import LoadDecision
from kvtier.chain.jobs import JobResult, Jobs
from kvtier.chain.keeping import Retention
from kvtier.chain.listeners import ChainListener, Listeners
from kvtier.chain.record import Recorder
from kvtier.chain.tier import Tier
from kvtier.chain.traffic import DEFAULT_BACKLOG_BYTES, Traffic
from kvtier.config.chain_config import ChainConfig, load_config
from kvtier.observe.metrics import MetricsReporter
from kvtier.plugins.registry import BackendRegistry, default_registry
from kvtier.spec import BytesLike, ClosedError

__all__ = ["Chain", "JobResult", "open_chain"]

log = logging.getLogger("kvtier.chain")

#: What a tier's part of a walk does with the indices offered to it: per
#: index, True where this tier settled it (stored it, found it).
Step = Callable[[int, Tier, list[int]], Sequence[bool]]
#: How often a read walks the tiers for keys that moved down while it walked.
_READ_WALKS = 3


def _frames(index: int, offered: list[int]) -> list[framing.Checked | None] | None:
    """Where a read of tier ``index`` puts the frames of its hits: none for the first
    tier, which has nothing above it to promote them into."""
    return [None] * len(offered) if index else None


class Chain(Retention):
    """An open tier chain (:meth:`keep`: :mod:`.keeping`).  Thread-safe; use :func:`open_chain`."""

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
        self._record = Recorder(config.record, namespace.tokens_per_block)  # record: in the YAML
        self.tiers: list[Tier] = []
        try:
            for tier_config in config.tiers:
                tier = Tier(tier_config, registry.create(tier_config.backend), namespace)
                # a tier whose backend cannot open starts failed and is retried,
                # unless it is required (kvtier.chain.health)
                tier.open(functools.partial(registry.create, tier_config.backend),
                          functools.partial(catalog.record_opened, tier, registry))
                self.tiers.append(tier)
        except BaseException:
            for tier in self.tiers:
                tier.close()
            self._record.close()
            raise
        self._load = LoadDecision.for_chain(config.load, self.tiers, registry)
        self._traffic = Traffic(self.tiers, backlog_bytes, self._load.readback.after(self._emit))
        self._jobs = Jobs(job_workers)
        self._listeners = Listeners(self._load.block_load, self._load.block_recompute)
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

    def _saw(self, op: str, keys: Sequence[bytes]) -> None:
        """A caller's call named ``keys``: recorded (record:), counted and traced (admit:)."""
        self._record(op, keys)
        self._traffic.admission.note(keys)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("chain is closed")

    # the walk -------------------------------------------------------------------
    def _walk(self, items: Iterable[int], step: Step) -> list[int]:
        """Offer ``items`` (indices into the caller's keys) to each tier in order,
        until every one is settled.

        Every read and write is this walk: ``step`` does one tier's part
        with the items still open and says which it settled.  Returns the
        items no tier settled.
        """
        remaining = list(items)
        for index, tier in enumerate(self.tiers):
            if not remaining:
                break
            settled = step(index, tier, remaining)
            remaining = [i for i, done in zip(remaining, settled) if not done]
        return remaining

    def _read_walk(
        self, keys: Sequence[bytes], step: Step, skip: set[int] | None = None
    ) -> tuple[list[int], list[tuple[int, int, BytesLike]]]:
        """A read's walk (``skip``: items not to read): ``(missed, (item, tier, frame) queued)``.

        A missed key may be on its way down: its queued copy serves it.  A
        block can also leave a tier the walk has yet to reach and land in
        one it has passed, entering and leaving the queue during the walk;
        the queue's count of entries says whether that could have happened,
        and then the keys still missed are walked again.
        """
        pending: Iterable[int] = [i for i in range(len(keys)) if not skip or i not in skip]
        queued: list[tuple[int, int, BytesLike]] = []
        in_queue = self._traffic.queued
        for _ in range(_READ_WALKS):
            entries = in_queue.entries  # read first: an entry after it counts
            early = in_queue.snapshot(keys)
            missed = []
            for i in self._walk(pending, step):
                found = in_queue.find(keys[i], early)
                if found is None:
                    missed.append(i)
                else:
                    queued.append((i, *found))
            if not missed or in_queue.entries == entries:
                break
            pending = missed
        return missed, queued

    def _decode_queued(
        self, index: int, key: bytes, blob: BytesLike, out: memoryview | None
    ) -> bytes | None:
        """Serve a queued block as its tier would: checked, and counted there.

        Into ``out`` when given (then the answer is ``b""``), else as new bytes.
        """
        tier = self.tiers[index]
        if out is None:
            payload = tier.decode_bytes(key, blob, held=False)
            if payload is not None:
                tier.stats.add(hits=1, bytes_out=len(payload))
            return payload
        if not tier.decode(key, blob, out, held=False):
            return None
        tier.stats.add(hits=1, bytes_out=out.nbytes)
        return b""

    # writes -------------------------------------------------------------------
    def put(self, keys: Sequence[bytes], blocks: Sequence[BytesLike]) -> list[bool]:
        """Store ``blocks[i]`` under ``keys[i]``; True where some tier took it.

        The first tier stores synchronously (blocks it refuses fall through to the
        next); ``through`` tiers below receive copies asynchronously.  The caller may
        reuse ``blocks`` as soon as this returns.
        """
        self._check_open()
        keys = check_keys(keys)
        payloads = byte_views(blocks, len(keys))
        self._saw("put", keys)
        self._traffic.storing(keys)  # a block stored again after it left: no deadline

        def step(index: int, tier: Tier, offered: list[int]) -> list[bool]:
            sub_keys = [keys[i] for i in offered]
            # the frame this tier stores serves a tier below of the same codec;
            # joined once, before the put, it is the copy the queue needs anyway
            same = self._traffic.writes_through(index) and self.tiers[index + 1].codec == tier.codec
            flags, evicted, frames = tier.put_payloads(
                sub_keys, [payloads[i] for i in offered], self._traffic.evicted_sink(index),
                join=same,
            )

            def frame_below(j: int) -> BytesLike:
                if same:
                    return joined(frames[j])  # one part already bytes: not copied
                codec = self.tiers[index + 1].codec
                return framing.encode(self._ns, sub_keys[j], payloads[offered[j]], codec)

            self._traffic.settle(index, sub_keys, flags, evicted, "put", frame_below, verify=False)
            return flags

        misses = set(self._walk(range(len(keys)), step))
        return [i not in misses for i in range(len(keys))]

    def put_blobs(
        self, keys: Sequence[bytes], blobs: Sequence[BytesLike], *, verify: bool = True
    ) -> list[bool]:
        """Store framed blocks (made by another chain of the same namespace).

        Each blob's header must match this chain's namespace and the key, or it is
        refused (False).  With ``verify`` false, payload checksums are left to the reads
        (each tier checks what it reads, unless configured not to), and a ``bytes`` blob
        is stored uncopied; a blob re-encoded for a tier's codec is checked all the same.
        """
        self._check_open()
        keys = check_keys(keys)
        byte_views(blobs, len(keys))  # only to name a mistake: recode takes the blobs
        self._traffic.storing(keys)

        def step(index: int, tier: Tier, offered: list[int]) -> list[bool]:
            sub_keys, sub_blobs = [keys[i] for i in offered], [blobs[i] for i in offered]
            flags, evicted = tier.put_blobs(
                sub_keys, sub_blobs, self._traffic.evicted_sink(index), verify=verify
            )
            # a copy for the queue: the caller may reuse its buffers
            self._traffic.settle(
                index, sub_keys, flags, evicted, "put", lambda j: bytes(sub_blobs[j]),
                verify=verify,
            )
            return flags

        misses = set(self._walk(range(len(keys)), step))  # tiers below: by their policies
        return [i not in misses for i in range(len(keys))]

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued asynchronous write (through, demotion, promotion) is done."""
        return self._traffic.flush(timeout)

    # reads --------------------------------------------------------------------
    def get(self, keys: Sequence[bytes], out: Sequence[Any]) -> list[bool]:
        """Fill ``out[i]`` (a writable buffer of the block's size) with block ``keys[i]``.

        Returns True where the block was found and checked.  Where it is
        False the content of ``out[i]`` is unspecified.  A block of another
        size than ``out[i]`` is a miss counted in ``size_mismatch``, and stays
        stored.  Hits below the first tier are promoted asynchronously.
        """
        self._check_open()
        keys = check_keys(keys)
        outs = writable(out, len(keys))
        self._saw("get", keys)
        probed = self._load.probed.take(keys, outs)  # read by a probe: not read twice

        def step(index: int, tier: Tier, offered: list[int]) -> list[bool]:
            start = perf_counter()  # every read teaches the tier's cost model
            frames = _frames(index, offered)
            flags = tier.get_into([keys[i] for i in offered], [outs[i] for i in offered], frames)
            self._load.observe(
                index, flags, [outs[i].nbytes for i in offered], perf_counter() - start
            )
            self._promote(index, keys, offered, frames, outs)
            return flags

        misses, queued = self._read_walk(keys, step, probed)
        found = [True] * len(keys)
        for i in misses:
            found[i] = False
        for i, index, blob in queued:
            found[i] = self._decode_queued(index, keys[i], blob, outs[i]) is not None
        return found

    def get_bytes(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Blocks as new ``bytes`` objects, for callers that do not know their sizes.

        Costs one copy more than :meth:`get`; hits below the first tier are
        promoted the same way.
        """
        self._check_open()
        keys = check_keys(keys)
        self._saw("get", keys)
        found: list[bytes | None] = [None] * len(keys)

        def step(index: int, tier: Tier, offered: list[int]) -> list[bool]:
            start = perf_counter()
            frames = _frames(index, offered)
            payloads = tier.get_payloads([keys[i] for i in offered], frames)
            self._load.observe(
                index, [p is not None for p in payloads], [len(p or b"") for p in payloads],
                perf_counter() - start,
            )
            for i, payload in zip(offered, payloads):
                found[i] = payload
            self._promote(index, keys, offered, frames, found)
            return [p is not None for p in payloads]

        for i, index, blob in self._read_walk(keys, step)[1]:
            found[i] = self._decode_queued(index, keys[i], blob, None)
        return found

    def get_blobs(self, keys: Sequence[bytes]) -> list[BytesLike | None]:
        """Framed blocks exactly as stored (header checked), for serving them on.

        Used by ``kvtier serve``: the receiving side checks them again.
        """
        self._check_open()
        keys = check_keys(keys)
        found: list[BytesLike | None] = [None] * len(keys)

        def step(index: int, tier: Tier, offered: list[int]) -> list[bool]:
            frames = _frames(index, offered)
            blobs = tier.get_blobs([keys[i] for i in offered], counted=True, frames=frames)
            for i, blob in zip(offered, blobs):
                found[i] = blob
            self._promote(index, keys, offered, frames)
            return [b is not None for b in blobs]

        for i, index, blob in self._read_walk(keys, step)[1]:
            found[i] = blob
            self.tiers[index].stats.add(hits=1)
        return found

    def _promote(
        self,
        source: int,
        keys: Sequence[bytes],
        offered: list[int],
        frames: list[framing.Checked | None] | None,
        payloads: Sequence[BytesLike | None] | None = None,
    ) -> None:
        """Promote the hits of tier ``source`` (``frames[j]`` for item ``offered[j]``),
        with their decoded payloads where the read has them (:meth:`Traffic.promote`)."""
        if not frames:
            return
        hits = [(i, f) for i, f in zip(offered, frames) if f is not None]
        if not hits:
            return
        decoded = None if payloads is None else [payloads[i] or b"" for i, _ in hits]
        self._traffic.promote(
            source, [keys[i] for i, _ in hits], [f for _, f in hits], decoded
        )

    def lookup(self, keys: Sequence[bytes]) -> list[int | None]:
        """Per key, the index of the first tier holding it, or None.

        Where loads are weighed (``load_policy: cost`` and a ``recompute`` model),
        an unmeasured tier found holding some is first probed (:meth:`_probe`).
        """
        self._check_open()
        keys = check_keys(keys)
        self._saw("lookup", keys)
        where: list[int | None] = [None] * len(keys)

        def step(index: int, tier: Tier, offered: list[int]) -> list[bool]:
            flags = tier.lookup([keys[i] for i in offered])
            for i, flag in zip(offered, flags):
                if flag:
                    where[i] = index
            return flags

        for i, index, _ in self._read_walk(keys, step)[1]:
            where[i] = index
        if self._load.weighs:
            self._probe(keys, where)
        return where

    def _probe(self, keys: Sequence[bytes], where: list[int | None]) -> None:
        """Measure each tier in ``where`` with no recent reads by reading a block it
        holds, or two (:meth:`LoadDecision.probe`): a fresh process would otherwise
        load a whole prefix from a slow tier before learning that it is slow.  The
        blocks read are promoted like any hit."""
        for index in self._load.unmeasured(where):
            tier = self.tiers[index]

            def read(i: int, index: int = index, tier: Tier = tier) -> tuple[Any, Any]:
                frames = _frames(index, [i])
                return frames, tier.get_payloads([keys[i]], frames)[0]

            held = [i for i, t in enumerate(where) if t == index]
            for i, frames, payload in self._load.probe(index, held, read, keys):
                if payload is None:  # gone or unsound since the walk: not held after all
                    where[i] = None
                    continue
                found: list[BytesLike | None] = [None] * i + [payload]  # by key index
                self._promote(index, keys, [i], frames, found)

    def prefix_hits(self, keys: Sequence[bytes], tokens_per_block: int | None = None) -> int:
        """How many leading keys are worth loading: held by some tier and, by the
        chain's ``load_policy``, faster to load than to recompute (:meth:`worth_loading`)."""
        return self.worth_loading(self.lookup(keys), tokens_per_block)

    recompute = property(lambda self: self._load.recompute)  # kvtier.chain.learned_cost

    def worth_loading(
        self,
        where: Sequence[int | None],
        tokens_per_block: int | None = None,
        block_bytes: int | None = None,
    ) -> int:
        """Of a prefix whose blocks :meth:`lookup` found in tiers ``where``, how many
        leading blocks to load (:mod:`kvtier.chain.cost`).

        With ``load_policy: cost`` and a ``recompute`` model: the held prefix
        that saves the most, ``load_margin`` times the time to recompute its
        tokens (``tokens_per_block`` each, default the namespace's) less its
        predicted load time over the tiers holding it; the held blocks left
        out are counted as declined.  Otherwise every leading held block.
        """
        return self._load.worth(where, tokens_per_block, block_bytes)

    def evict(self, keys: Sequence[bytes]) -> int:
        """Remove keys from every tier; returns how many were held somewhere.

        Queued asynchronous writes finish first, so none brings a key back.
        """
        return sum(self.evict_each(keys))

    def evict_each(self, keys: Sequence[bytes]) -> list[bool]:
        """:meth:`evict`, answered per key: True where some tier held it (and now none does)."""
        self._check_open()
        keys = check_keys(keys)
        self.flush()
        self._load.probed.drop(keys)
        removed = [False] * len(keys)
        for index, tier in enumerate(self.tiers):
            self._traffic.unsaved.mark(index, keys, False)
            flags = tier.evict(keys)
            for i, flag in enumerate(flags):
                removed[i] = removed[i] or flag
            self._emit("removed", index, (k for k, f in zip(keys, flags) if f), "evict")
        self._traffic.deadlines.drop(keys)  # gone from every tier: a put again has none
        return removed

    # events -----------------------------------------------------------------------
    def add_listener(self, listener: ChainListener) -> None:
        """Call ``listener`` with a :class:`~kvtier.chain.listeners.ChainEvent` for every
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
    def submit_put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], *, held: bool = False
    ) -> int:
        """Start a put of the bytes ``blocks`` hold now; returns a job id.

        Keep each buffer unchanged until the job completes.  The job stores
        exactly what a block held at this call, or refuses it (False) where
        its buffer changed before the job copied it: the checksum taken here
        must match the job's copy, so a changed buffer is never stored, with
        a checksum that fails or with one over the changed bytes.  Mistakes
        in the arguments raise here.

        ``held=True`` is for a caller that holds every buffer unchanged until
        the job completes by construction (an engine's transfer buffers,
        released only when it hears the job is done): the job then stores
        the buffers as :meth:`put` would, without the checksum at this call
        and the copy it checks (one xxh3 pass and one copy per block less,
        see BENCHMARKS.md).  A buffer changed anyway is stored as changed.
        """
        keys = check_keys(keys)
        views = byte_views(blocks, len(keys))
        if held:
            return self._jobs.submit("put", self.put, keys, views)
        sums = [framing.digest(view) for view in views]  # a read pass, not a copy
        return self._jobs.submit("put", self._put_submitted, keys, views, sums)

    def _put_submitted(
        self, keys: list[bytes], views: list[memoryview], sums: list[int]
    ) -> list[bool]:
        """A :meth:`submit_put` job: copy each block, and put the copies that match."""
        copied = [framing.copy_digest(view) for view in views]
        copies = [copy for copy, _ in copied]
        same = [digest == expected for (_, digest), expected in zip(copied, sums)]
        kept = [i for i, ok in enumerate(same) if ok]
        if len(kept) < len(keys):
            log.warning(
                "kvtier: %d of %d block(s) changed after submit_put and before its job read "
                "them; not stored (keep a submitted buffer unchanged until its job completes)",
                len(keys) - len(kept), len(keys),
            )
        flags = self.put([keys[i] for i in kept], [copies[i] for i in kept]) if kept else []
        stored = [False] * len(keys)
        for i, flag in zip(kept, flags):
            stored[i] = flag
        return stored

    def submit_get(self, keys: Sequence[bytes], out: Sequence[Any]) -> int:
        """Start a get into ``out``; returns a job id at once.

        ``out`` is filled by the job; mistakes in the arguments raise here.
        """
        keys = check_keys(keys)
        return self._jobs.submit("get", self.get, keys, writable(out, len(keys)))

    def submit_lookup(self, keys: Sequence[bytes]) -> int:
        """Start a lookup; the job's result is :meth:`lookup`'s answer."""
        return self._jobs.submit("lookup", self.lookup, check_keys(keys))

    def poll(self) -> list[JobResult]:
        """Jobs finished since the last poll (each reported once)."""
        return self._jobs.poll()

    def wait(self, job_ids: Iterable[int] | None = None, timeout: float | None = None) -> bool:
        """Wait for the given jobs (default: all running ones); True if all finished."""
        return self._jobs.wait(job_ids, timeout)

    # introspection and lifecycle ------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per-tier counters, latency, health and backend figures."""
        return {
            "namespace": self.namespace.hex,
            **self._load.policy_stats(),  # load_policy, and recompute: where its model came from
            "tiers": [
                {**tier.snapshot(), **self._load.tier_stats(i)}
                for i, tier in enumerate(self.tiers)
            ],
            "pending_writes": self._traffic.pending.count,
        }

    def close(self) -> None:
        """Finish queued work and close every tier.  Idempotent."""
        if not self._jobs.stop():
            return
        if self._reporter is not None:
            self._reporter.stop(self)
        self._shutdown()

    def _shutdown(self) -> None:
        self._jobs.shutdown()
        self.flush()
        try:
            self._traffic.save_unsaved()
        except Exception:  # closing must go on: the tiers still need closing
            log.exception("kvtier: saving write-back blocks at close failed")
        self.flush()
        self._closed = True
        self._load.close()  # what it learned of recomputing goes to the store
        self._record.close()
        self._traffic.shutdown()
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
