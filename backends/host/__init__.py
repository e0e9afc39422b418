"""The ``host`` backend: a RAM tier with a byte capacity and LRU, ARC or S3-FIFO eviction.

Blocks live in process memory as immutable ``bytes``: ``put`` copies once (not
at all when handed ``bytes``), ``get`` returns the stored object itself and
``get_into`` copies straight into the caller's buffers.  Capacity counts block
bytes and is enforced before an insert, under the one lock, so nobody (stats
included) ever sees it exceeded.  ``get``, ``get_into`` and a ``put`` of a key
already stored are uses; ``lookup`` is not (the chain probes tiers with it).

``eviction`` picks the policy that decides what to drop, any of
:mod:`kvtier.policies` (:data:`POLICIES`): ``lru``, ``arc`` (scan-resistant),
``s3fifo`` (frequency-aware) or ``adaptive``.  The policy orders keys and
counts bytes; the blocks themselves are in a dict of the tier's store
(:mod:`.store`).  An explicit ``kvtier_evict`` is the caller's choice, not
the policy's.

``tenants`` sets each tenant's quota and weight
(:mod:`kvtier.policies.tenancy`), and the tenants of one process share one
capacity: the instances of one group share a store (:mod:`.shared`), and
``stats()`` adds the figures of the instance's tenant (``tenant_bytes.<t>``,
``tenant_refused.<t>``, ``tenant_evicted.<t>``, ``tenant_expired.<t>``).
``expire`` makes blocks expire after their write or unused (:mod:`.store`).
``kvtier_keep`` marks blocks kept, no victims while marked, within each
tenant's ``keep`` budget (:mod:`.kept`); ``stats()`` adds ``kept_bytes`` (the
tenant's), ``kept_blocks`` and ``keep_refused``.  ``kvtier_expire`` gives
blocks a deadline of their own, sooner than ``expire`` (:mod:`.store`), and
``kvtier_deadlines`` says how long each has left.

May import :mod:`kvtier.block` (buffers), :mod:`kvtier.policies` and
:mod:`kvtier.spec`.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from kvtier.block.buffers import joined, nbytes, own, parts_nbytes, scatter
from kvtier.policies import NAMES
from kvtier.policies.sizing import SIZING_OPTION
from kvtier.policies.tenancy import (
    EXPIRE_OPTION,
    TENANT_OPTION,
    TENANTS_OPTION,
    parse_expiry,
    parse_tenants,
)
from kvtier.spec import BytesLike, Capabilities, Option, ScanEntry
from kvtier.spec.base import Deadlines, Evicted, Expire, GetInto, Keep, PutParts, Scan
from kvtier.spec.shared import CAPACITY, but, eviction

from . import shared
from .store import HostStore, Settings, prefix_of

__all__ = ["POLICIES", "HostBackend"]

#: The eviction policies the host tier offers: every one.
POLICIES = NAMES


def _positive(size: int) -> None:
    if size <= 0:
        raise ValueError(f"must be a positive size, got {size}")


_OPTIONS: Mapping[str, Option] = {
    "capacity": but(CAPACITY, required=True),
    "eviction": eviction(POLICIES, default="lru"),
    "max_block_size": Option("size", "Refuse larger blocks (default: only the capacity limits).",
                             default=None, check=_positive),
    "prefault": Option("size", "Bytes of process memory touched at open, so that the first "
                       "blocks land in mapped pages (at most the capacity; 0: none).",
                       default="128MiB", internal=True),
    "sizing_sample": SIZING_OPTION,
    "tenants": TENANTS_OPTION,
    "tenant": TENANT_OPTION,
    "expire": EXPIRE_OPTION,
    "share": Option("str", "host tiers of one process naming one group share one capacity: "
                    "the chains of one open_tenants name theirs", internal=True),
}

#: Entries per kvtier_scan batch.
_SCAN_BATCH = 1024


_malloc_tuned = False
#: Freed heap glibc keeps mapped (the trim threshold set by _tune_malloc); 0 if untuned.
_kept_heap = 0
#: Pieces of the prefault: below the mmap threshold, so they come from the heap.
_PREFAULT_PIECE = 16 << 20
# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # the largest glibc accepts on 64-bit


def _tune_malloc(capacity: int) -> None:
    """Let freed blocks be reused by later ones instead of going back to the kernel.

    glibc serves allocations of megabytes with fresh ``mmap`` pages and
    returns them on free (or trims them off the heap), so every stored block
    would pay a page fault per 4 KiB on its copy, several times slower than a
    copy into memory already mapped (BENCHMARKS.md, "Figures behind design
    choices").  Blocks up
    to 32 MiB come from the heap instead, and up to ``capacity`` (at most
    1 GiB) of freed heap stays mapped: memory the tier may fill anyway.
    Process-wide, done once, glibc only; ``MALLOC_MMAP_THRESHOLD_`` or
    ``MALLOC_TRIM_THRESHOLD_`` in the environment leave malloc as configured.
    """
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    global _kept_heap
    _kept_heap = max(_MMAP_THRESHOLD_MAX * 2, min(capacity, 1 << 30))
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
    mallopt(_M_TRIM_THRESHOLD, _kept_heap)


def _prefault(nbytes: int) -> None:
    """Touch ``nbytes`` of heap and free it again, so that the tier's first blocks reuse it.

    A fresh tier's first blocks otherwise land in pages the process never
    used, and every 4 KiB pays a page fault and the kernel's zeroing during
    the copy.  Freed, the pieces join the heap's free top, which
    _tune_malloc keeps mapped up to its trim threshold: touching that much
    or more would have free() trim it all away again, so three quarters of
    it at most.  It spares the first puts their page faults, at the cost of
    the touch at open and that much resident memory from the start, memory
    the tier was going to fill (BENCHMARKS.md, "Figures behind design
    choices").
    Blocks must be stored from the thread that opened the tier to find it:
    glibc gives other threads arenas of their own.
    """
    left = min(nbytes, _kept_heap * 3 // 4)
    pieces = []
    while left > 0:
        piece = min(left, _PREFAULT_PIECE)
        pieces.append(b"\1" * piece)  # a fill, unlike calloc, writes every page
        left -= piece
    del pieces


class HostBackend(PutParts, GetInto, Scan, Keep, Expire, Deadlines):
    """A RAM tier: blocks in process memory, bounded by ``capacity`` bytes.

    The lifecycle, batch checks and repeated keys are :class:`BlockStore`'s;
    the policy object exists while the tier is open, under ``_lock``.
    """

    name = "host"
    OPTIONS = _OPTIONS

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()  # guards _store's installation, not its blocks
        self._store: HostStore | None = None
        self._group: str | None = None  # the shared store's, if any
        self._prefix = b""  # this namespace's, in a shared store
        self._eviction = "lru"
        self._max_block_size: int | None = None

    # lifecycle -------------------------------------------------------------
    def _open(self, options: Mapping[str, Any], namespace: str) -> None:
        # options arrive checked against _OPTIONS, defaults filled (BackendHandle.open)
        settings = Settings(
            capacity=options["capacity"], eviction=options["eviction"],
            max_block_size=options["max_block_size"], rules=parse_tenants(options["tenants"]),
            expiry=parse_expiry(options["expire"]), sizing_sample=options["sizing_sample"])
        tenant: str = options["tenant"]
        group = shared.group_of(options["share"], settings)
        if group is None:  # a store of its own: keys are the blocks' names
            store, prefix = HostStore(settings, shared=False, tenant=tenant), b""
        else:
            prefix = prefix_of(namespace)
            store = shared.acquire(group, settings, prefix, tenant)
        _tune_malloc(settings.capacity)
        _prefault(min(options["prefault"], settings.capacity))
        with self._lock:
            self._store, self._group, self._prefix = store, group, prefix
            self._eviction = settings.eviction
            self._max_block_size = settings.max_block_size

    def _capabilities(self) -> Capabilities:
        with self._lock:
            # before open this describes the backend in general (for `kvtier backends`)
            store = self._store
            return Capabilities(
                persistent=False,
                shared=False,
                thread_safe=True,
                max_block_size=None if store is None or self._max_block_size is None
                else store.limit(store.tenant(self._prefix)),
                capacity=None if store is None else store.settings.capacity,
                reports_evictions=True,
                eviction=self._eviction,
            )

    def _stats(self) -> dict[str, int | float]:
        return self._live().stats(self._prefix)

    def _close(self) -> None:
        with self._lock:
            store, self._store = self._store, None
        if store is not None and self._group is not None:
            shared.release(self._group, store, self._prefix)

    # data path -------------------------------------------------------------
    def _put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> list[bool]:
        return self._live().put(self._prefix, keys, blocks, [nbytes(b) for b in blocks], own,
                                evicted)

    def _put_parts(
        self, keys: Sequence[bytes], parts: Sequence[Sequence[BytesLike]], evicted: Evicted
    ) -> list[bool]:
        return self._live().put(self._prefix, keys, parts, [parts_nbytes(p) for p in parts],
                                joined, evicted)

    def _get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return self._live().get(self._prefix, keys)

    def _get_into(
        self, keys: Sequence[bytes], buffers: Sequence[Sequence[memoryview]]
    ) -> list[int | None]:
        found = self._live().get(self._prefix, keys)
        # Stored bytes are never mutated, so copying outside the lock is safe
        # even if another thread evicts them meanwhile.
        sizes: list[int | None] = []
        for data, bufs in zip(found, buffers, strict=True):
            if data is None:
                sizes.append(None)
                continue
            if len(data) == sum(buf.nbytes for buf in bufs):
                scatter(data, bufs)
            sizes.append(len(data))
        return sizes

    def _lookup(self, keys: Sequence[bytes]) -> list[bool]:
        return self._live().lookup(self._prefix, keys)

    def _evict(self, keys: Sequence[bytes]) -> list[bool]:
        return self._live().evict(self._prefix, keys)

    def _keep(self, keys: Sequence[bytes], keep: bool) -> list[bool | None]:
        return self._live().keep(self._prefix, keys, keep)

    def _expire(self, keys: Sequence[bytes], after: float) -> list[bool | None]:
        return self._live().expire(self._prefix, keys, after)

    def _deadlines(self, keys: Sequence[bytes]) -> list[float | None]:
        return self._live().deadlines(self._prefix, keys)

    def kit_tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        """Raw access for the conformance kit (kvtier.testing.RawAccess); no hook."""
        self.ensure_open()
        return self._live().tamper(self._prefix, key, transform)

    def _scan(self, namespace: str | None) -> Iterator[list[ScanEntry]]:
        # An instance holds one namespace, its own.  Key and size are copied under
        # the lock once (a dict walk, no block bytes); batches are cut from that copy.
        own_ns = self.namespace
        held = self._live().held(self._prefix) if namespace in (None, own_ns) else []
        return iter([
            [ScanEntry(own_ns, key, size) for key, size in held[start : start + _SCAN_BATCH]]
            for start in range(0, len(held), _SCAN_BATCH)
        ])

    # internals -------------------------------------------------------------
    def _live(self) -> HostStore:
        """The open store (a close may have raced the call)."""
        store = self._store
        if store is None:
            raise self.closed_error()
        return store
