"""Backends written the way a third party would, on the public API alone.

:class:`BufferDict` is built on :class:`kvtier.spec.BlockStore` and the
buffer helpers of :mod:`kvtier.block.buffers` (its gather write and scatter
read use them), declares ``eviction="lru"``, and gives the kit raw access
with a plain ``kit_tamper`` method: the kit's ``corruption`` and ``recency``
groups run on it.  :class:`OldWays` is the same store written before raw
access and the eviction left the contract's hook and ``Capabilities.extra``:
the deprecated ``Tamper`` mixin and ``extra={"eviction": "lru"}``, which
must keep passing the kit for a release.  :class:`NoRawAccess` gives the kit
none, for a test class that reaches the store itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvtier.block.buffers import joined, nbytes, own, parts_nbytes, scatter
from kvtier.spec import BytesLike, Capabilities, Option
from kvtier.spec.base import BlockStore, Evicted, GetInto, PutParts, Tamper


class NoRawAccess(PutParts, GetInto, BlockStore):
    """A dict with a byte capacity, least recently used out first; no raw access."""

    name = "buffer-dict"
    OPTIONS = {"capacity": Option("size", "bytes of blocks to hold", default="4MiB")}

    def __init__(self) -> None:
        super().__init__()
        self.blocks: OrderedDict[bytes, bytes] = OrderedDict()
        self.lock = threading.Lock()
        self.capacity = 4 << 20
        self.used = 0
        self.evictions = 0

    def _open(self, options: Mapping[str, Any], namespace: str) -> None:
        self.capacity = options["capacity"]

    def _close(self) -> None:
        self.blocks.clear()

    def _capabilities(self) -> Capabilities:
        return Capabilities(capacity=self.capacity, reports_evictions=True, eviction="lru")

    def _stats(self) -> Mapping[str, int]:
        with self.lock:
            return {"used_bytes": self.used, "blocks": len(self.blocks),
                    "capacity_bytes": self.capacity, "evictions": self.evictions}

    def _store(self, keys: Sequence[bytes], sizes: list[int],
               data: Callable[[int], bytes], evicted: Evicted) -> list[bool]:
        stored = []
        with self.lock:
            for i, (key, size) in enumerate(zip(keys, sizes)):
                if key in self.blocks:
                    self.blocks.move_to_end(key)  # a put of a stored key is a use
                    stored.append(True)
                    continue
                if size > self.capacity:
                    stored.append(False)
                    continue
                while self.used + size > self.capacity:
                    old_key, old = self.blocks.popitem(last=False)
                    self.used -= len(old)
                    self.evictions += 1
                    evicted.append((old_key, old))
                self.blocks[key] = data(i)
                self.used += size
                stored.append(True)
        return stored

    def _put(self, keys: Sequence[bytes], blocks: Sequence[BytesLike],
             evicted: Evicted) -> list[bool]:
        sizes = [nbytes(block) for block in blocks]
        return self._store(keys, sizes, lambda i: own(blocks[i]), evicted)

    def _put_parts(self, keys: Sequence[bytes], parts: Sequence[Sequence[BytesLike]],
                   evicted: Evicted) -> list[bool]:
        sizes = [parts_nbytes(gather) for gather in parts]
        return self._store(keys, sizes, lambda i: joined(parts[i]), evicted)

    def _held(self, keys: Sequence[bytes]) -> list[bytes | None]:
        with self.lock:
            found = [self.blocks.get(key) for key in keys]
            for key, data in zip(keys, found):
                if data is not None:
                    self.blocks.move_to_end(key)  # a get is a use
            return found

    def _get(self, keys: Sequence[bytes]) -> list[BytesLike | None]:
        return list(self._held(keys))

    def _get_into(self, keys: Sequence[bytes],
                  buffers: Sequence[Sequence[memoryview]]) -> list[int | None]:
        sizes: list[int | None] = []
        for data, scatter_list in zip(self._held(keys), buffers):
            if data is not None and len(data) == sum(nbytes(b) for b in scatter_list):
                scatter(data, scatter_list)
            sizes.append(None if data is None else len(data))
        return sizes

    def _lookup(self, keys: Sequence[bytes]) -> list[bool]:
        with self.lock:
            return [key in self.blocks for key in keys]

    def _evict(self, keys: Sequence[bytes]) -> list[bool]:
        removed = []
        with self.lock:
            for key in keys:
                data = self.blocks.pop(key, None)
                if data is not None:
                    self.used -= len(data)
                removed.append(data is not None)
        return removed

    def _rewrite(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        with self.lock:
            if key not in self.blocks:
                return False
            self.blocks[key] = bytes(transform(self.blocks[key]))  # raw: no count updated
            return True


class BufferDict(NoRawAccess):
    """The same store, giving the kit raw access the new way."""

    def kit_tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        self.ensure_open()
        return self._rewrite(key, transform)


class OldWays(Tamper, NoRawAccess):
    """The same store on the deprecated ways: the ``kvtier_tamper`` hook, eviction in ``extra``."""

    def _tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        return self._rewrite(key, transform)

    def _capabilities(self) -> Capabilities:
        return Capabilities(capacity=self.capacity, reports_evictions=True,
                            extra={"eviction": "lru", "capacity_scope": "namespace"})


class ProcessScoped(BufferDict):
    """Declares a capacity each process keeps its own (``capacity_scope="process"``)."""

    def _capabilities(self) -> Capabilities:
        return Capabilities(capacity=self.capacity, reports_evictions=True, eviction="lru",
                            capacity_scope="process", shared=True)
