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
counts bytes; the blocks themselves are in the tier's own dict.  An explicit
``kvtier_evict`` is the caller's choice, not the policy's.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from kvtier.block.buffers import joined, nbytes, own, parts_nbytes, scatter
from kvtier.policies import NAMES, Policy, new_policy
from kvtier.policies.sizing import SIZING_OPTION, Sizer
from kvtier.spec import BytesLike, Capabilities, Option, ScanEntry
from kvtier.spec.base import Evicted, GetInto, PutParts, Scan
from kvtier.spec.shared import CAPACITY, but, eviction

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
}

_B = TypeVar("_B")
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


class HostBackend(PutParts, GetInto, Scan):
    """A RAM tier: blocks in process memory, bounded by ``capacity`` bytes.

    The lifecycle, batch checks and repeated keys are :class:`BlockStore`'s;
    the policy object exists while the tier is open, under ``_lock``.
    """

    name = "host"
    OPTIONS = _OPTIONS

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._policy: Policy | None = None
        self._blocks: dict[bytes, bytes] = {}  # the policy's keys, with their bytes
        self._eviction = "lru"
        self._max_block_size: int | None = None
        self._limit = 0  # largest block admitted: min(capacity, max_block_size)
        self._sizer: Sizer | None = None

    # lifecycle -------------------------------------------------------------
    def _open(self, options: Mapping[str, Any], namespace: str) -> None:
        # One instance serves one tier and one namespace, so RAM needs no
        # layout by namespace; it is kept only for kvtier_scan.
        # options arrive checked against _OPTIONS, defaults filled (BackendHandle.open)
        capacity: int = options["capacity"]
        max_block_size: int | None = options["max_block_size"]
        eviction: str = options["eviction"]
        with self._lock:
            self._policy = new_policy(eviction, capacity)
            self._blocks = {}
            sample: float = options["sizing_sample"]
            self._sizer = Sizer(eviction, capacity, sample) if sample > 0 else None
            _tune_malloc(capacity)
            _prefault(min(options["prefault"], capacity))
            self._eviction = eviction
            self._max_block_size = max_block_size
            self._limit = capacity if max_block_size is None else min(capacity, max_block_size)

    def _capabilities(self) -> Capabilities:
        with self._lock:
            # before open this describes the backend in general (for `kvtier backends`)
            policy = self._policy
            return Capabilities(
                persistent=False,
                shared=False,
                thread_safe=True,
                max_block_size=None if self._max_block_size is None else self._limit,
                capacity=None if policy is None else policy.capacity,
                reports_evictions=True,
                eviction=self._eviction,
            )

    def _stats(self) -> dict[str, int | float]:
        with self._lock:
            policy = self._live()
            return {
                "used_bytes": policy.used,
                "blocks": len(policy),
                "capacity_bytes": policy.capacity,
                "evictions": policy.evictions,
                **policy.stats(),
                **(self._sizer.stats() if self._sizer is not None else {}),
            }

    def _close(self) -> None:
        with self._lock:
            self._policy = None
            self._blocks = {}

    # data path -------------------------------------------------------------
    def _put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> list[bool]:
        return self._store(keys, blocks, nbytes, own, evicted)

    def _put_parts(
        self, keys: Sequence[bytes], parts: Sequence[Sequence[BytesLike]], evicted: Evicted
    ) -> list[bool]:
        return self._store(keys, parts, parts_nbytes, joined, evicted)

    def _get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        with self._lock:
            access, blocks = self._live().access, self._blocks
            if self._sizer is not None:
                self._sizer.got(keys)
            return [blocks[key] if access(key) else None for key in keys]

    def _get_into(
        self, keys: Sequence[bytes], buffers: Sequence[Sequence[memoryview]]
    ) -> list[int | None]:
        with self._lock:
            access, blocks = self._live().access, self._blocks
            if self._sizer is not None:
                self._sizer.got(keys)
            found = [blocks[key] if access(key) else None for key in keys]
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
        with self._lock:
            return self._live().holds(keys)

    def _evict(self, keys: Sequence[bytes]) -> list[bool]:
        with self._lock:
            remove, blocks = self._live().remove, self._blocks
            removed = [remove(key) for key in keys]
            for key, gone in zip(keys, removed, strict=True):
                if gone:
                    del blocks[key]
            return removed

    def kit_tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        """Raw access for the conformance kit (kvtier.testing.RawAccess); no hook."""
        self.ensure_open()
        with self._lock:
            policy, blocks = self._live(), self._blocks
            old = blocks.get(key)
            if old is None:
                return False
            # Recency is left alone, but the byte count follows the new length
            # so the capacity still holds; a grown block may push others out,
            # and they are dropped unreported as there is no caller to take them.
            new = bytes(transform(old))
            blocks[key] = new
            policy.resize(key, len(new))
            for gone in policy.shed():
                del blocks[gone]
            return True

    def _scan(self, namespace: str | None) -> Iterator[list[ScanEntry]]:
        # RAM holds one namespace, its own.  Key and size are copied under the
        # lock once (a dict walk, no block bytes); batches are cut from that copy.
        own_ns = self.namespace
        with self._lock:
            held = self._live().held() if namespace in (None, own_ns) else []
        return iter([
            [ScanEntry(own_ns, key, size) for key, size in held[start : start + _SCAN_BATCH]]
            for start in range(0, len(held), _SCAN_BATCH)
        ])

    # internals -------------------------------------------------------------
    def _live(self) -> Policy:
        """The open policy; the caller holds the lock (a close may have raced the call)."""
        policy = self._policy
        if policy is None:
            raise self.closed_error()
        return policy

    def _store(
        self,
        keys: Sequence[bytes],
        blocks: Sequence[_B],
        size_of: Callable[[_B], int],
        to_bytes: Callable[[_B], bytes],
        evicted: Evicted,
    ) -> list[bool]:
        stored: list[bool] = []
        sizes = [size_of(block) for block in blocks]
        with self._lock:
            policy, held = self._live(), self._blocks
            limit = self._limit
            for key, block, size in zip(keys, blocks, sizes, strict=True):
                if policy.access(key):
                    stored.append(True)  # immutable per key: keep what is there
                elif size > limit:
                    stored.append(False)
                else:
                    # Copied under the lock so a key already stored costs no copy;
                    # the GIL would serialise the memcpy anyway.
                    for gone in policy.admit(key, size):
                        evicted.append((gone, held.pop(gone)))
                    held[key] = to_bytes(block)
                    stored.append(True)
            if self._sizer is not None:
                self._sizer.stored(keys, sizes, limit)
        return stored
