"""``KvtierL2Adapter``: a kvtier chain as an LMCache (0.5) multiprocess-mode L2 adapter.

LMCache's storage manager drives L2 adapters from two controller threads
(store, prefetch) through a non-blocking interface: each ``submit_*`` returns a
task id at once, and the adapter signals one eventfd per operation when tasks
finish; the controller then collects the results (``pop_completed_store_tasks``,
``query_lookup_and_lock_result``, ``query_load_result``).

Here every task runs as a job of the chain's own asynchronous surface
(``submit_put``, ``submit_lookup``, ``submit_get``), so the controllers never
wait for storage.  One completion thread collects finished jobs
(``Chain.poll``), records the results and writes the eventfd.

Locks
    A lookup-and-lock pins each hit until ``submit_unlock`` (counted: two
    locks need two unlocks).  A pinned key deleted through
    :meth:`KvtierL2Adapter.delete` (LMCache's eviction) is gone for every
    lookup from then on, but leaves the chain only at its last unlock, so
    its lock holders can still load it; a key deleted while a lookup is in
    flight is never reported locked by it.  Blocks of non-persistent tiers
    (the RAM tier, which evicts for room at every store) are also *copied*
    into adapter memory at lock time, and a load of a pinned key is served
    from that copy, so such a block cannot be lost before unlock whatever
    the chain evicts.
    Blocks of persistent tiers (``fs``, ``object``) are not copied: their
    tiers drop blocks only by their own ``capacity``/``expire`` settings,
    an outside delete or a fault, and then the load reports a miss, never
    wrong data.  ``lock_copies: all`` copies those too (a full guarantee at
    the cost of reading every hit at lookup time).  Copies are bounded by
    ``max_locked_bytes``; a hit that would exceed it is reported not found.
    The size of a copy is LMCache's layout hint for the key's group, else
    the size the key was stored with here, else read from the block.

Stores
    A store holds a reference to each of its memory objects until its job
    completes: LMCache's callers may drop theirs at once, and an object
    freed before the job read it would be refused as changed.

Usage
    ``get_usage`` gives LMCache's figures.  ``total_bytes_used`` and the bytes
    per ``cache_salt`` (LMCache's per-salt quotas) are LMCache's own count of
    what the adapter told its listeners: each key's payload bytes once when
    first stored, taken off when deleted.  ``total_capacity_bytes`` is the sum
    of the tiers' capacities, the most the chain holds (when no two tiers
    hold the same block); 0, LMCache's "unknown or unlimited", while a tier
    has none.  The adapter declares no capacity to LMCache
    (``max_capacity_bytes=0``): the chain's tiers evict by their own policies,
    and LMCache runs no second, global eviction over them.  kvtier's figures
    (framed blocks, one copy per tier) are in ``report_status``.  ``delete``
    is synchronous: when it returns the keys are out of the chain, and
    listeners have heard of the keys that were held.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import AdapterUsage, L2AdapterInterface
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase

import kvtier
from kvtier.spec import KvtierError

from .keep import PrefixKeeper
from .settings import AdapterSettings
from .signals import Counters, EventFd
from .tenancy import LMCacheTenancy

if TYPE_CHECKING:
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.distributed.internal_api import L1MemoryDesc
    from lmcache.v1.memory_management import MemoryObj

__all__ = ["KvtierL2Adapter", "KvtierL2AdapterConfig"]

log = logging.getLogger("kvtier.contrib.lmcache")

#: While jobs are outstanding the completion thread waits for the oldest one
#: at most this long before collecting whatever else finished: a slow object
#: read must not hold back the eventfd of a host hit queued behind it.
_POLL_S = 0.002


class KvtierL2AdapterConfig(L2AdapterConfigBase):
    """LMCache config class of the adapter, found by the plugin loader by its name.

    ``from_dict`` gets ``adapter_params``: ``kvtier_config`` (required: the
    chain's YAML), ``namespace`` (a model name or a :class:`kvtier.Namespace`
    mapping, default ``"lmcache"``), ``lock_copies`` (``ram`` or ``all``),
    ``max_locked_bytes`` (default ``1GiB``), ``job_workers`` (default 4), and
    ``tenants`` and ``shared_tenants`` (:mod:`.tenancy`), ``keep_prefixes`` (:mod:`.keep`).
    A bad value, or a chain YAML that does not validate, stops LMCache at
    start-up with the message.
    """

    def __init__(self, settings: AdapterSettings) -> None:
        self.settings = settings

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KvtierL2AdapterConfig:
        return cls(AdapterSettings.from_params(d))

    @classmethod
    def help(cls) -> str:
        return (
            "kvtier L2 adapter (plugin) adapter_params:\n"
            "- kvtier_config (str): path of the kvtier chain YAML (required)\n"
            "- namespace (str | object): model name or kvtier namespace (default 'lmcache')\n"
            "- lock_copies ('ram' | 'all'): which locked blocks are copied (default 'ram')\n"
            "- max_locked_bytes (size): bound on those copies (default '1GiB')\n"
            "- job_workers (int): chain job threads (default 4)\n"
            "- tenants ('salt' | {salt: tenant}), shared_tenants (list): docs/tenants.md\n"
            "- keep_prefixes (list), chunk_size, hash_algorithm: prefixes kept, same doc\n"
            "`kvtier lmcache-args tiers.yaml` prints the whole --l2-adapter flag."
        )


def _bytes_of(obj: MemoryObj) -> memoryview:
    """The object's bytes (its logical size) as a flat, writable ``B`` view.

    ``byte_array`` of LMCache's tensor objects is a ctypes view of format
    ``<B``, which slice assignment refuses; the cast view is the same memory.
    """
    return memoryview(obj.byte_array).cast("B")


def _layout_bytes(desc: MemoryLayoutDesc) -> int:
    return sum(int(s.numel()) * d.itemsize for s, d in zip(desc.shapes, desc.dtypes))


class KvtierL2Adapter(L2AdapterInterface):
    """LMCache ``L2AdapterInterface`` over one kvtier chain; thread-safe.

    Built by LMCache's plugin loader from ``{"type": "plugin", "module_path":
    "kvtier.contrib.lmcache", "class_name": "KvtierL2Adapter",
    "adapter_params": {"kvtier_config": "tiers.yaml"}}``.
    """

    def __init__(
        self,
        config: KvtierL2AdapterConfig | Mapping[str, Any],
        l1_memory_desc: L1MemoryDesc | None = None,
    ) -> None:
        super().__init__(max_capacity_bytes=0)
        if not isinstance(config, KvtierL2AdapterConfig):
            config = KvtierL2AdapterConfig.from_dict(dict(config))
        self.settings = config.settings
        self._tenancy = LMCacheTenancy(self.settings)  # a chain per tenant (tenancy.py)
        self.chain, self._io = self._tenancy.chain, self._tenancy.io
        self._keeper = PrefixKeeper(self.settings, self._tenancy)  # keep_prefixes (keep.py)
        copy_all = self.settings.lock_copies == "all"
        self._copy_tier = [copy_all or not t.capabilities.persistent for t in self.chain.tiers]
        self._efds = {op: EventFd() for op in ("store", "lookup", "load")}
        self._cond = threading.Condition()
        self._task_ids = itertools.count()
        self._handlers: dict[int, Callable[[kvtier.JobResult], None]] = {}
        self._local: deque[Callable[[], None]] = deque()
        self._stores: dict[int, L2StoreResult] = {}
        self._storing: dict[int, list[MemoryObj]] = {}  # each store's objects, until it is done
        self._lookups: dict[int, Bitmap] = {}
        self._loads: dict[int, Bitmap] = {}
        self._pins: dict[bytes, int] = {}
        self._copies: dict[bytes, bytes | bytearray] = {}
        self._copied_bytes = 0
        self._deferred: set[bytes] = set()  # deleted, removed from the chain at last unlock
        #: payload sizes of the keys LMCache was told are stored (and not yet deleted)
        self._held: dict[bytes, int] = {}
        #: lookups in flight: their keys, and those of them deleted since they started
        self._inflight: dict[int, tuple[frozenset[bytes], set[bytes]]] = {}
        #: orders what listeners hear: a store's news and a delete's are never interleaved
        self._telling = threading.Lock()
        self._counters = Counters()
        self._closing = False
        self._thread = threading.Thread(
            target=self._complete_loop, name="kvtier-lmcache", daemon=True
        )
        self._thread.start()

    # eventfds ---------------------------------------------------------------
    def get_store_event_fd(self) -> int:
        return self._efds["store"].fd

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._efds["lookup"].fd

    def get_load_event_fd(self) -> int:
        return self._efds["load"].fd

    # store ------------------------------------------------------------------
    def submit_store_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> int:
        """Store ``objects`` (LMCache's L1 buffers, read straight) under ``keys``."""
        task_id = next(self._task_ids)
        sizes = [obj.get_size() for obj in objects]
        kv = [self._tenancy.key(k) for k in keys]

        def done(res: kvtier.JobResult | None) -> None:
            flags = list(res.result) if res is not None and res.error is None else []
            stored = [i for i, flag in enumerate(flags) if flag]
            ok = len(flags) == len(keys) and len(stored) == len(keys)
            with self._telling:
                with self._cond:
                    self._storing.pop(task_id, None)  # read: LMCache's objects are its own again
                    self._counters.stores += 1
                    self._counters.store_failures += not ok
                    self._stores[task_id] = L2StoreResult(ok, sum(sizes[i] for i in stored))
                    new = self._hold(kv, sizes, stored)
                if new:  # stored again: LMCache already counts it, as its own adapters do
                    self._notify_keys_stored([keys[i] for i in new], [sizes[i] for i in new])
            self._keeper.done([keys[i] for i in stored], load=False)  # asked, not waited for
            self._efds["store"].signal()

        if len(keys) != len(objects):
            log.error("kvtier: store task with %d keys and %d objects", len(keys), len(objects))
            self._run_local(lambda: done(None))
            return task_id
        with self._cond:  # the views below do not keep an object alive: this does
            self._storing[task_id] = list(objects)
        self._submit(
            lambda: self._io.submit_put(kv, [_bytes_of(obj) for obj in objects]), done
        )
        return task_id

    def _hold(self, kv: list[bytes], sizes: list[int], stored: list[int]) -> list[int]:
        """Count the keys ``stored`` (indices) in the chain; those not counted before.

        A key whose removal waited for its unlock is stored again: it stays.
        """
        new = []
        for i in stored:
            self._deferred.discard(kv[i])
            if kv[i] not in self._held:
                self._held[kv[i]] = sizes[i]
                new.append(i)
        return new

    def pop_completed_store_tasks(self) -> dict[int, L2StoreResult]:
        with self._cond:
            done, self._stores = self._stores, {}
        return done

    # lookup and lock ----------------------------------------------------------
    def submit_lookup_and_lock_task(
        self, keys: list[ObjectKey], group_layout_descs: dict[int, MemoryLayoutDesc]
    ) -> int:
        """Find ``keys`` and pin the hits (see the module notes); a bitmap of the pinned.

        ``group_layout_descs`` gives the size of a block to copy; LMCache calls it
        advisory, and without it the size is the one stored, or read from the block.
        """
        task_id = next(self._task_ids)
        kv = [self._tenancy.key(k) for k in keys]
        sizes = {gid: _layout_bytes(desc) for gid, desc in (group_layout_descs or {}).items()}
        with self._cond:  # before the job starts: a delete from now on vetoes its keys
            self._inflight[task_id] = (frozenset(kv), set())
        self._submit(
            lambda: self._io.submit_lookup(kv),
            lambda res: self._after_lookup(task_id, keys, kv, sizes, res),
        )
        return task_id

    def _after_lookup(
        self, task_id: int, keys: list[ObjectKey], kv: list[bytes],
        sizes: Mapping[int, int], res: kvtier.JobResult | None,
    ) -> None:
        where = list(res.result) if res is not None and res.error is None else []
        if len(where) != len(kv):
            where = [None] * len(kv)
        worth = self.chain.worth_loading(where)  # the chain's load_policy
        if worth < len(where) and where[worth] is not None:  # the rest is faster to recompute
            where[worth:] = [None] * (len(where) - worth)
        locked = [False] * len(kv)
        to_copy: list[tuple[int, int]] = []  # (index, size)
        unsized: list[int] = []
        with self._cond:
            for i, tier in enumerate(where):
                if tier is None or self._deleted(task_id, kv[i]):
                    continue
                if kv[i] in self._copies or not self._copy_tier[tier]:
                    self._pin(kv[i])
                    locked[i] = True
                    continue
                size = sizes.get(keys[i].object_group_id, self._held.get(kv[i]))
                if size is None:
                    unsized.append(i)
                elif self._reserve(size):
                    to_copy.append((i, size))
        read: list[tuple[int, bytes | bytearray, bool]] = []
        if unsized:  # no hint, not stored here: only the block's header has its size
            try:
                payloads = self._io.get_bytes([kv[i] for i in unsized])
            except KvtierError as exc:  # closed meanwhile: misses
                log.warning("kvtier: reading blocks to lock failed: %r", exc)
                payloads = [None] * len(unsized)
            for i, payload in zip(unsized, payloads):
                if payload is not None and self._reserve(len(payload)):
                    read.append((i, payload, True))
        if not to_copy:
            self._after_copy(task_id, kv, locked, read)
            return
        buffers = [bytearray(size) for _, size in to_copy]

        def copied(res: kvtier.JobResult | None) -> None:
            flags = list(res.result) if res is not None and res.error is None else []
            if len(flags) != len(to_copy):
                flags = [False] * len(to_copy)
            got: list[tuple[int, bytes | bytearray, bool]] = [
                (i, b, bool(f)) for (i, _), b, f in zip(to_copy, buffers, flags)
            ]
            self._after_copy(task_id, kv, locked, read + got)

        self._submit(lambda: self._io.submit_get([kv[i] for i, _ in to_copy], buffers), copied)

    def _deleted(self, task_id: int, key: bytes) -> bool:
        """Whether ``key`` was deleted since lookup ``task_id`` started, or waits for removal."""
        return key in self._deferred or key in self._inflight[task_id][1]

    def _reserve(self, size: int) -> bool:
        """Take ``size`` bytes of the copies' bound; False (and counted) past it."""
        with self._cond:
            if self._copied_bytes + size > self.settings.max_locked_bytes:
                self._counters.lock_over_budget += 1
                return False
            self._copied_bytes += size
            return True

    def _after_copy(
        self, task_id: int, kv: list[bytes], locked: list[bool],
        copies: list[tuple[int, bytes | bytearray, bool]],
    ) -> None:
        """Keep the copies found (index, buffer, found) unless deleted meanwhile; pin them."""
        with self._cond:
            for i, buffer, found in copies:
                deleted = self._deleted(task_id, kv[i])
                if found and not deleted and kv[i] not in self._copies:
                    self._copies[kv[i]] = buffer
                    self._counters.lock_copies += 1
                else:  # a miss, deleted, or another lock copied it meanwhile
                    self._copied_bytes -= len(buffer)
                if not deleted and kv[i] in self._copies:
                    self._pin(kv[i])
                    locked[i] = True
        self._finish_lock(task_id, locked)

    def _pin(self, key: bytes) -> None:
        self._pins[key] = self._pins.get(key, 0) + 1

    def _finish_lock(self, task_id: int, locked: list[bool]) -> None:
        bitmap = Bitmap(len(locked))
        for i, flag in enumerate(locked):
            if flag:
                bitmap.set(i)
        with self._cond:
            self._inflight.pop(task_id, None)
            self._counters.lookups += 1
            self._counters.locked += sum(locked)
            self._lookups[task_id] = bitmap
        self._efds["lookup"].signal()

    def query_lookup_and_lock_result(self, task_id: int) -> Bitmap | None:
        with self._cond:
            return self._lookups.pop(task_id, None)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        """Drop one pin per key; the last one frees its copy and removes a deleted key."""
        ready: list[bytes] = []
        with self._cond:
            for key in keys:
                kv = self._tenancy.key(key)
                count = self._pins.get(kv, 0)
                if count > 1:
                    self._pins[kv] = count - 1
                    continue
                if count == 1:
                    del self._pins[kv]
                    copy = self._copies.pop(kv, None)
                    if copy is not None:
                        self._copied_bytes -= len(copy)
                    if kv in self._deferred:
                        ready.append(kv)
        if ready:
            self._run_local(lambda: self._remove_deleted(ready))

    # load ---------------------------------------------------------------------
    def submit_load_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> int:
        """Fill ``objects`` (LMCache's buffers) with ``keys``: from lock copies, else the chain."""
        task_id = next(self._task_ids)
        if len(keys) != len(objects):
            log.error("kvtier: load task with %d keys and %d objects", len(keys), len(objects))
            self._run_local(lambda: self._finish_load(task_id, keys, [False] * len(keys)))
            return task_id
        kv = [self._tenancy.key(k) for k in keys]
        views = [_bytes_of(obj) for obj in objects]
        with self._cond:  # hold the copies now: an early unlock must not drop them
            copied = {i: self._copies[k] for i, k in enumerate(kv) if k in self._copies}
        rest = [i for i in range(len(kv)) if i not in copied]

        def done(res: kvtier.JobResult | None) -> None:
            hits = [False] * len(kv)
            flags = list(res.result) if res is not None and res.error is None else []
            for i, flag in zip(rest, flags):
                hits[i] = bool(flag)
            for i, copy in copied.items():
                if len(copy) == views[i].nbytes:
                    views[i][:] = copy
                    hits[i] = True
            self._finish_load(task_id, keys, hits)

        if rest:
            self._submit(
                lambda: self._io.submit_get([kv[i] for i in rest], [views[i] for i in rest]),
                done,
            )
        else:
            self._run_local(lambda: done(None))
        return task_id

    def _finish_load(self, task_id: int, keys: list[ObjectKey], hits: list[bool]) -> None:
        bitmap = Bitmap(len(hits))
        for i, hit in enumerate(hits):
            if hit:
                bitmap.set(i)
        with self._cond:
            self._counters.load_hits += sum(hits)
            self._counters.load_misses += len(hits) - sum(hits)
            self._loads[task_id] = bitmap
        found = [k for k, hit in zip(keys, hits) if hit]
        if found:
            self._notify_keys_accessed(found)
        self._keeper.done(found, load=True)
        self._efds["load"].signal()

    def query_load_result(self, task_id: int) -> Bitmap | None:
        with self._cond:
            return self._loads.pop(task_id, None)

    # eviction and usage ---------------------------------------------------------
    def delete(self, keys: list[ObjectKey]) -> None:
        """Remove ``keys``; done when this returns, for usage, lookups and listeners.

        Listeners hear of the keys that were held (stored here, or found in
        the chain).  A pinned key is gone for new lookups at once, stays
        loadable by its lock holders, and leaves the chain at its last unlock.
        """
        kv = list(dict.fromkeys(self._tenancy.key(k) for k in keys))
        by_kv = {self._tenancy.key(k): k for k in keys}
        now: list[bytes] = []
        deferred: list[bytes] = []
        with self._cond:
            for key in kv:
                for wanted, vetoed in self._inflight.values():
                    if key in wanted:  # a lookup in flight must not lock it
                        vetoed.add(key)
                if key not in self._pins:
                    now.append(key)
                elif key not in self._deferred:
                    self._deferred.add(key)
                    deferred.append(key)
                    self._counters.deletes_deferred += 1
        removed = set(deferred)
        if now:
            try:
                removed.update(k for k, flag in zip(now, self._io.evict_each(now)) if flag)
            except KvtierError as exc:  # closed: nothing was removed
                log.warning("kvtier: delete failed: %r", exc)
        with self._telling:
            with self._cond:
                sizes = {key: self._held.pop(key, 0) for key in kv
                         if key in self._held or key in removed}
            if sizes:
                self._notify_keys_deleted([by_kv[k] for k in sizes], list(sizes.values()))

    def _remove_deleted(self, kv: list[bytes]) -> None:
        """Remove deleted keys whose last lock went, unless stored again meanwhile."""
        with self._cond:
            kv = [k for k in kv if k in self._deferred and k not in self._pins]
        if kv:
            self._io.evict_each(kv)
        with self._cond:
            self._deferred.difference_update(kv)

    def get_usage(self) -> AdapterUsage:
        """The bytes of the chunks stored here, once each, and the chain's capacity.

        LMCache's base class counts what ``_notify_keys_stored``/``_deleted``
        told it; the capacity is :meth:`_capacity`.
        """
        return replace(super().get_usage(), total_capacity_bytes=self._capacity())

    def _capacity(self) -> int:
        """Sum of the tiers' capacities; 0 (unknown or unlimited) while one has none."""
        capacities = [t.capabilities.capacity for t in self.chain.tiers]
        bounded = [c for c in capacities if c]  # a tier not open yet declares none either
        return sum(bounded) if capacities and len(bounded) == len(capacities) else 0

    def report_status(self) -> dict[str, Any]:
        """Health, hits and bytes of every tier (framed, each copy), and the adapter's counters."""
        tiers = self.chain.stats()["tiers"]
        with self._cond:
            counters = asdict(self._counters)
            pinned, copied = len(self._pins), self._copied_bytes
        used = [int(t.get("backend_stats", {}).get("used_bytes", 0) or 0) for t in tiers]
        return {
            "is_healthy": any(t["healthy"] for t in tiers),
            "type": type(self).__name__,
            "tiers": [
                {**{k: t.get(k) for k in ("name", "backend", "healthy", "hits", "misses",
                                          "corrupt")},
                 "used_bytes": u, "capacity_bytes": tier.capabilities.capacity}
                for t, u, tier in zip(tiers, used, self.chain.tiers)
            ],
            "tier_used_bytes": sum(used),
            "pinned_keys": pinned,
            "copied_bytes": copied,
            **counters,
        }

    def close(self) -> None:
        """Finish outstanding tasks, close the chain and the eventfds.  Idempotent."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        self._keeper.close()
        self._tenancy.close()
        for efd in self._efds.values():
            efd.close()

    # completion machinery ---------------------------------------------------------
    def _submit(
        self, start: Callable[[], int], handler: Callable[[kvtier.JobResult | None], None]
    ) -> None:
        """Start a chain job and register what runs when it finishes.

        Both under the lock: the completion thread looks a job up only while
        holding it, so it cannot see the job finish before its handler exists.
        A chain that refuses the job (closed) makes the handler run with None.
        """
        with self._cond:
            try:
                job_id = start()
            except Exception as exc:
                log.warning("kvtier: chain refused a job: %r", exc)
                self._counters.job_errors += 1
                self._local.append(lambda: handler(None))
            else:
                self._handlers[job_id] = handler
            self._cond.notify_all()

    def _run_local(self, fn: Callable[[], None]) -> None:
        with self._cond:
            self._local.append(fn)
            self._cond.notify_all()

    def _complete_loop(self) -> None:
        while True:
            with self._cond:
                while not (self._handlers or self._local or self._closing):
                    self._cond.wait()
                if self._closing and not (self._handlers or self._local):
                    return
                local = list(self._local)
                self._local.clear()
                oldest = min(self._handlers) if self._handlers else None
            for fn in local:
                self._guarded(fn)
            if oldest is not None:
                self._io.wait([oldest], timeout=_POLL_S)
            for res in self._io.poll():
                with self._cond:
                    handler = self._handlers.pop(res.job_id, None)
                if handler is None:
                    continue
                if res.error is not None:
                    log.warning("kvtier: chain job %s failed: %r", res.kind, res.error)
                    with self._cond:
                        self._counters.job_errors += 1
                self._guarded(functools.partial(handler, res))

    @staticmethod
    def _guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # the thread must live on: LMCache waits on its eventfds
            log.exception("kvtier: completing an L2 task failed")
