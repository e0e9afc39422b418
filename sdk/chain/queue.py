"""The chain's asynchronous writes: their byte budget, their count, and the blocks in them.

A block on its way down (demoted out of a full tier, or written through to
the tier below) has left one tier and not reached the next: until it
lands, reads are served from the copy in the queue (:class:`Queued`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import SupportsIndex

from kvtier.spec import BytesLike

__all__ = ["Backlog", "DemotionSink", "Pending", "Queued"]


class Backlog:
    """Bytes of queued asynchronous writes for one tier, bounded so writers wait for room."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = 0
        self.cond = threading.Condition()

    def acquire(self, nbytes: int, block: bool = True) -> bool:
        """Take room for ``nbytes``; without ``block``, False where there is none now."""
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


class Pending:
    """How many asynchronous writes are queued or running, so ``flush`` can wait for none."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = threading.Condition()

    def start(self) -> None:
        with self._idle:
            self.count += 1

    def done(self) -> None:
        with self._idle:
            self.count -= 1
            if not self.count:
                self._idle.notify_all()

    def wait(self, timeout: float | None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self.count == 0, timeout)


QueuedBlock = tuple[int, BytesLike]  # (index of the tier it is on its way to, its frame)


class Queued:
    """Framed blocks on their way to a tier, readable by key until they land."""

    def __init__(self) -> None:
        self._blocks: dict[bytes, QueuedBlock] = {}
        self._lock = threading.Lock()
        #: How many times blocks have entered the queue: a read that saw it
        #: unchanged across its walk knows no block slipped past it.
        self.entries = 0

    def add(self, index: int, pairs: Iterable[tuple[bytes, BytesLike]]) -> None:
        """Queue a batch's blocks; of a key repeated in it, the first, as a backend stores."""
        with self._lock:
            added: set[bytes] = set()
            for key, blob in pairs:
                if key not in added:
                    added.add(key)
                    self._blocks[key] = (index, blob)
            self.entries += 1

    def landed(self, index: int, keys: Sequence[bytes], blobs: Sequence[BytesLike]) -> None:
        """Forget the blocks of a finished write, unless a newer copy replaced them meanwhile."""
        with self._lock:
            for key, blob in zip(keys, blobs):
                if self._blocks.get(key, (index, None))[1] is blob:
                    del self._blocks[key]

    def snapshot(self, keys: Sequence[bytes]) -> dict[bytes, QueuedBlock]:
        """The queued copies of ``keys``, taken before a read looks at the tiers.

        A write that lands while the read walks the tiers has left the queue
        by the time the walk ends, and may have landed in a tier the walk
        had already passed; the copy taken first still has it.
        """
        with self._lock:
            if not self._blocks:
                return {}
            return {k: self._blocks[k] for k in keys if k in self._blocks}

    def find(self, key: bytes, early: dict[bytes, QueuedBlock]) -> QueuedBlock | None:
        """The queued copy of ``key`` now, or the one :meth:`snapshot` saw."""
        with self._lock:
            return self._blocks.get(key) or early.get(key)


class DemotionSink(list[tuple[bytes, BytesLike]]):
    """An evicted list that queues each block a backend reports as on its way to tier ``below``.

    Above a write-back tier, a victim becomes readable from the chain the
    moment the backend reports it, not when its put returns: by then the
    backend may long have dropped it, and a reader would find the block
    nowhere for the rest of the put.
    """

    def __init__(self, queued: Queued, below: int) -> None:
        super().__init__()
        self._queued, self._below = queued, below

    def append(self, item: tuple[bytes, BytesLike]) -> None:
        self._queued.add(self._below, (item,))
        super().append(item)

    def insert(self, index: SupportsIndex, item: tuple[bytes, BytesLike]) -> None:
        self._queued.add(self._below, (item,))
        super().insert(index, item)

    def extend(self, items: Iterable[tuple[bytes, BytesLike]]) -> None:
        items = list(items)
        self._queued.add(self._below, items)
        super().extend(items)

    def __iadd__(  # type: ignore[override, misc]
        self, items: Iterable[tuple[bytes, BytesLike]]
    ) -> DemotionSink:
        self.extend(items)
        return self
