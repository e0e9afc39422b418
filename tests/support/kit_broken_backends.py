"""A correct reference backend, and broken variants of it that the conformance kit must catch.

:class:`DictBackend` keeps blocks in an ``OrderedDict`` (LRU order) with an
optional byte capacity whose evictions it reports, gives the kit raw access
(``kit_tamper``), implements ``kvtier_scan``, and persists to a directory when
the ``dir`` option is set: one file per block, named by the key's hex, holding
the block's bytes, written to a temporary name and renamed into place.  It is
thread-safe.

Each variant below breaks one promise of the contract by overriding one small
method, the way real bugs hide in one place.  ``tests/testing/test_kit.py`` runs the
kit against each one and checks which groups fail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, MutableSequence, Sequence
from pathlib import Path
from typing import Any

from kvtier.spec import (
    BytesLike,
    Capabilities,
    ClosedError,
    ConfigError,
    Option,
    ScanEntry,
    hookimpl,
)

Evicted = MutableSequence[tuple[bytes, BytesLike]]

_SUFFIX = ".blk"
_NAMESPACE = re.compile(r"[0-9a-f]{32}")


class DictBackend:
    """The reference: correct, so the kit must pass it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: OrderedDict[bytes, BytesLike] = OrderedDict()
        self._used = 0
        self._capacity: int | None = None
        self._dir: Path | None = None
        self._namespace = ""
        self._state = "new"
        self._evictions = 0
        self._scan_batch = 5

    # lifecycle -------------------------------------------------------------
    @hookimpl
    def kvtier_options(self) -> Mapping[str, Option]:
        return {
            "dir": Option("str", "directory to persist blocks in; unset keeps them in memory"),
            "capacity": Option("size", "bytes of blocks held before evicting the oldest"),
            "scan_batch": Option("int", "entries per kvtier_scan batch", default=5),
        }

    @hookimpl
    def kvtier_open(self, options: Mapping[str, Any], namespace: str) -> None:
        self._check_not_closed()
        self._capacity = options.get("capacity")
        self._namespace = namespace
        self._scan_batch = self._check_scan_batch(options.get("scan_batch", 5))
        if options.get("dir"):
            self._dir = Path(options["dir"]) / namespace
            self._dir.mkdir(parents=True, exist_ok=True)
            self._load()
        self._state = "open"

    def _load(self) -> None:
        assert self._dir is not None
        found = []
        for path in self._dir.iterdir():
            if path.suffix != _SUFFIX:
                path.unlink()  # a temporary file of a writer that died
                continue
            found.append((path.stat().st_mtime_ns, bytes.fromhex(path.stem), path.read_bytes()))
        for _, key, data in sorted(found):
            self._blocks[key] = data
        self._used = sum(len(data) for _, _, data in found)

    @hookimpl
    def kvtier_capabilities(self) -> Capabilities:
        self._check_not_closed()  # never opened: the defaults (in memory, unbounded)
        return Capabilities(
            persistent=self._dir is not None,
            thread_safe=True,
            capacity=self._capacity,
            reports_evictions=True,
            eviction="lru",
        )

    @hookimpl
    def kvtier_stats(self) -> Mapping[str, int]:
        with self._guard():
            stats = {"used_bytes": self._used, "blocks": len(self._blocks),
                     "evictions": self._evictions}
        if self._capacity is not None:
            stats["capacity_bytes"] = self._capacity
        return stats

    @hookimpl
    def kvtier_close(self) -> None:
        with self._lock:
            self._state = "closed"
            self._blocks.clear()

    # data path -------------------------------------------------------------
    @hookimpl
    def kvtier_put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> list[bool]:
        out = []
        with self._guard():
            for key, block in zip(keys, blocks):
                if key in self._blocks:
                    self._touch(key)  # a put of a stored key is a use
                    out.append(True)
                    continue
                data = self._copy(block)
                size = len(memoryview(data).cast("B"))
                if self._capacity is not None and size > self._capacity:
                    out.append(False)
                    continue
                self._make_room(size, evicted)
                self._write(key, data)
                self._insert(key, data)
                out.append(True)
        return out

    @hookimpl
    def kvtier_get(self, keys: Sequence[bytes]) -> list[BytesLike | None]:
        with self._guard():
            return [self._read(key) for key in keys]

    @hookimpl
    def kvtier_lookup(self, keys: Sequence[bytes]) -> list[bool]:
        with self._guard():
            return [key in self._blocks for key in keys]

    @hookimpl
    def kvtier_evict(self, keys: Sequence[bytes]) -> list[bool]:
        with self._guard():
            return [self._remove(key) for key in keys]

    def kit_tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        """Raw access for the kit (kvtier.testing.RawAccess): a plain method, no hook."""
        with self._guard():
            old = self._blocks.get(key)
            if old is None:
                return False
            new = transform(bytes(old))
            self._blocks[key] = new  # raw: the byte count is not updated
            self._write_raw(key, new)
            return True

    @hookimpl
    def kvtier_scan(self, namespace: str | None) -> Iterator[list[ScanEntry]]:
        with self._guard():  # raises ClosedError at the call, as the contract asks
            entries = self._listing(namespace)
        step = self._scan_batch
        return iter([entries[i : i + step] for i in range(0, len(entries), step)])

    # the places the variants break -------------------------------------------
    def _check_scan_batch(self, value: int) -> int:
        if value < 1:
            raise ConfigError(f"must be at least 1, got {value}", key="scan_batch")
        return value

    def _touch(self, key: bytes) -> None:
        """A use: ``key`` becomes the most recently used."""
        self._blocks.move_to_end(key)

    def _listing(self, namespace: str | None) -> list[ScanEntry]:
        """What the store holds: in memory its own namespace, on disk every namespace."""
        if self._dir is None:
            if namespace not in (None, self._namespace):
                return []
            return [ScanEntry(self._namespace, key, len(memoryview(data).cast("B")))
                    for key, data in self._blocks.items()]
        root = self._dir.parent
        names = [namespace] if namespace is not None else sorted(os.listdir(root))
        out = []
        for name in names:
            if not _NAMESPACE.fullmatch(name) or not (root / name).is_dir():
                continue
            for path in sorted((root / name).iterdir()):
                if path.suffix == _SUFFIX:  # temporary files end in .tmp
                    stat = path.stat()
                    out.append(ScanEntry(name, bytes.fromhex(path.stem), stat.st_size,
                                         stat.st_mtime))
        return out

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        with self._lock:
            self._check_open()
            yield

    def _check_open(self) -> None:
        if self._state != "open":
            state = "closed" if self._state == "closed" else "not open"
            raise ClosedError(f"dict backend is {state}")

    def _check_not_closed(self) -> None:
        if self._state == "closed":
            raise ClosedError("dict backend is closed")

    def _copy(self, block: BytesLike) -> BytesLike:
        return bytes(block)

    def _insert(self, key: bytes, data: BytesLike) -> None:
        self._blocks[key] = data
        self._used += len(memoryview(data).cast("B"))

    def _read(self, key: bytes) -> BytesLike | None:
        data = self._blocks.get(key)
        if data is not None:
            self._touch(key)
        return data

    def _remove(self, key: bytes) -> bool:
        data = self._blocks.pop(key, None)
        if data is None:
            return False
        self._used -= len(memoryview(data).cast("B"))
        self._unlink(key)
        return True

    def _make_room(self, size: int, evicted: Evicted) -> None:
        assert self._capacity is None or size <= self._capacity
        while self._capacity is not None and self._used + size > self._capacity:
            key, data = self._blocks.popitem(last=False)
            self._used -= len(memoryview(data).cast("B"))
            self._unlink(key)
            self._evictions += 1  # the figure counts what capacity pushed out, nothing else
            self._report(evicted, key, data)

    def _report(self, evicted: Evicted, key: bytes, data: BytesLike) -> None:
        evicted.append((key, data))

    def _path(self, key: bytes) -> Path:
        assert self._dir is not None
        return self._dir / f"{key.hex()}{_SUFFIX}"

    def _write(self, key: bytes, data: BytesLike) -> None:
        if self._dir is None:
            return
        path = self._path(key)
        tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # readers, and a reopen after a crash, see all or nothing

    def _write_raw(self, key: bytes, data: bytes) -> None:
        if self._dir is not None:
            self._path(key).write_bytes(data)

    def _unlink(self, key: bytes) -> None:
        if self._dir is not None:
            self._path(key).unlink(missing_ok=True)


class ServesEvicted(DictBackend):
    """A read cache that evict forgets to invalidate: evicted keys still answer get."""

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[bytes, BytesLike] = {}

    def _insert(self, key: bytes, data: BytesLike) -> None:
        super()._insert(key, data)
        self._cache[key] = data

    def _read(self, key: bytes) -> BytesLike | None:
        data = super()._read(key)
        return data if data is not None else self._cache.get(key)


class ForgetsOnReopen(DictBackend):
    """Writes its files but never reads them back: declares persistence it lacks."""

    def _load(self) -> None:
        pass


class IgnoresCapacity(DictBackend):
    """Declares a capacity and never evicts for it."""

    def _make_room(self, size: int, evicted: Evicted) -> None:
        pass


class TornWrites(DictBackend):
    """Writes block files in place, in pieces: a crash leaves a partial file it then serves."""

    def _write(self, key: bytes, data: BytesLike) -> None:
        if self._dir is None:
            return
        view = memoryview(data).cast("B")
        with open(self._path(key), "wb", buffering=0) as f:
            for start in range(0, len(view), 16384):
                f.write(view[start : start + 16384])


class TwoStepWrites(DictBackend):
    """Writes a block file in place in two steps, a head and then the rest: a crash in between
    leaves a prefix of the block, which a reopen then serves."""

    def _write(self, key: bytes, data: BytesLike) -> None:
        if self._dir is None:
            return
        view = memoryview(data).cast("B")
        head = min(len(view), 4096)
        with open(self._path(key), "wb") as f:
            f.write(view[:head])
            f.flush()
            f.write(view[head:])


class WrongKeyOrder(DictBackend):
    """Answers a get batch in sorted key order, not request order: another key's bytes."""

    @hookimpl
    def kvtier_get(self, keys: Sequence[bytes]) -> list[BytesLike | None]:
        with self._guard():
            return [self._read(key) for key in sorted(keys)]


class NotThreadSafe(DictBackend):
    """Declares thread_safe=True but updates its index by copy, modify, swap, unlocked."""

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        self._check_open()
        yield

    def _insert(self, key: bytes, data: BytesLike) -> None:
        blocks = self._blocks.copy()
        time.sleep(0)  # another thread's insert lands here and is overwritten
        blocks[key] = data
        self._blocks = blocks
        self._used += len(memoryview(data).cast("B"))


class RaisesOnMiss(DictBackend):
    """Raises KeyError for a key it does not hold, instead of answering None."""

    def _read(self, key: bytes) -> BytesLike | None:
        data = self._blocks[key]
        self._blocks.move_to_end(key)
        return data


class SilentEvictions(DictBackend):
    """Declares reports_evictions=True but drops capacity victims without reporting them."""

    def _report(self, evicted: Evicted, key: bytes, data: BytesLike) -> None:
        pass


class AliasesBuffer(DictBackend):
    """Keeps a view of the caller's buffer instead of copying it."""

    def _copy(self, block: BytesLike) -> BytesLike:
        return block if isinstance(block, bytes) else memoryview(block)


class WrongUsedAfterReopen(DictBackend):
    """Rebuilds used_bytes from a rounded per-file figure when it reopens."""

    def _load(self) -> None:
        super()._load()
        self._used = 4096 * len(self._blocks)


class ResurrectsAfterReopen(DictBackend):
    """Deletes only the files it wrote itself: a block evicted after a reopen comes back."""

    def __init__(self) -> None:
        super().__init__()
        self._written: set[bytes] = set()

    def _write(self, key: bytes, data: BytesLike) -> None:
        super()._write(key, data)
        self._written.add(key)

    def _unlink(self, key: bytes) -> None:
        if key in self._written:
            super()._unlink(key)


class TamperMissesCache(DictBackend):
    """kit_tamper rewrites the file, but reads are served from memory: damage never shows."""

    def kit_tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        with self._guard():
            old = self._blocks.get(key)
            if old is None:
                return False
            self._write_raw(key, transform(bytes(old)))
            return True


class ReusesReadBuffers(DictBackend):
    """Reads into one scratch buffer per position of the batch, reused by the next get: a
    block a get returned changes when a later get reads another block into its position."""

    def __init__(self) -> None:
        super().__init__()
        self._scratch: list[bytearray] = []

    @hookimpl
    def kvtier_get(self, keys: Sequence[bytes]) -> list[BytesLike | None]:
        with self._guard():
            while len(self._scratch) < len(keys):
                self._scratch.append(bytearray())
            out: list[BytesLike | None] = []
            for buffer, key in zip(self._scratch, keys):
                data = self._read(key)
                if data is None:
                    out.append(None)
                    continue
                size = len(memoryview(data).cast("B"))
                if len(buffer) < size:
                    buffer.extend(bytes(size - len(buffer)))
                buffer[:size] = data
                out.append(memoryview(buffer)[:size])
            return out


class MixesRepeatedKeys(DictBackend):
    """Plans a batch by key: a key repeated with other bytes keeps the first value's length
    and the last value's bytes."""

    @hookimpl
    def kvtier_put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> list[bool]:
        sizes: dict[bytes, int] = {}
        latest: dict[bytes, bytes] = {}
        for key, block in zip(keys, blocks):
            data = bytes(block)
            sizes.setdefault(key, len(data))
            latest[key] = data
        merged = [latest[k][: sizes[k]].ljust(sizes[k], b"\0") for k in keys]
        return super().kvtier_put(keys, merged, evicted)


class KeepsLastRepeated(DictBackend):
    """Of a key repeated in one put, stores the last occurrence (a dict built from the batch)."""

    @hookimpl
    def kvtier_put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> list[bool]:
        last = dict(zip(keys, blocks))
        return super().kvtier_put(keys, [last[k] for k in keys], evicted)


class ReplacesStored(DictBackend):
    """A put of a stored key replaces its block: blocks are not immutable once stored."""

    @hookimpl
    def kvtier_put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> list[bool]:
        with self._guard():
            for key in keys:
                self._remove(key)
        return super().kvtier_put(keys, blocks, evicted)


class LookupEvicts(DictBackend):
    """Counts a lookup hit as an access whose record is charged to the capacity, and trims
    to capacity there, where it has no evicted list to report victims in."""

    _ACCESS_RECORD = 512

    @hookimpl
    def kvtier_lookup(self, keys: Sequence[bytes]) -> list[bool]:
        with self._guard():
            found = []
            for key in keys:
                hit = key in self._blocks
                if hit:
                    self._blocks.move_to_end(key)
                    self._used += self._ACCESS_RECORD
                found.append(hit)
            if self._capacity is not None:
                while self._blocks and self._used > self._capacity:
                    victim, data = self._blocks.popitem(last=False)
                    self._used -= len(memoryview(data).cast("B"))
                    self._unlink(victim)
            return found


class LookupRefreshes(DictBackend):
    """Counts a lookup hit as a use: it moves the block to the young end of the LRU order."""

    @hookimpl
    def kvtier_lookup(self, keys: Sequence[bytes]) -> list[bool]:
        with self._guard():
            for key in keys:
                if key in self._blocks:
                    self._blocks.move_to_end(key)
            return [key in self._blocks for key in keys]


class ClaimsShared(DictBackend):
    """Declares shared=True, while each instance keeps its own blocks."""

    @hookimpl
    def kvtier_capabilities(self) -> Capabilities:
        return dataclasses.replace(super().kvtier_capabilities(), shared=True)


class ScanSizesOnDisk(DictBackend):
    """Lists each block with the space it takes on disk (whole 4 KiB pages), not its length."""

    def _listing(self, namespace: str | None) -> list[ScanEntry]:
        return [e._replace(size=-(-e.size // 4096) * 4096) for e in super()._listing(namespace)]


class ScanListsEvicted(DictBackend):
    """Lists from an index of the keys it stored, which evict forgets to update."""

    def __init__(self) -> None:
        super().__init__()
        self._index: dict[bytes, int] = {}

    def _insert(self, key: bytes, data: BytesLike) -> None:
        super()._insert(key, data)
        self._index[key] = len(memoryview(data).cast("B"))

    def _listing(self, namespace: str | None) -> list[ScanEntry]:
        if namespace not in (None, self._namespace):
            return []
        return [ScanEntry(self._namespace, key, size) for key, size in self._index.items()]


class ScanIgnoresNamespace(DictBackend):
    """Lists every namespace of the directory whichever namespace it is asked for."""

    def _listing(self, namespace: str | None) -> list[ScanEntry]:
        return super()._listing(None)


class UsableAfterClose(DictBackend):
    """close() keeps serving: hooks after close do not raise ClosedError."""

    @hookimpl
    def kvtier_close(self) -> None:
        pass


#: Every broken variant, by name.
BROKEN: dict[str, type[DictBackend]] = {
    cls.__name__: cls
    for cls in (
        ServesEvicted,
        ForgetsOnReopen,
        IgnoresCapacity,
        TornWrites,
        TwoStepWrites,
        WrongKeyOrder,
        NotThreadSafe,
        RaisesOnMiss,
        SilentEvictions,
        AliasesBuffer,
        WrongUsedAfterReopen,
        ResurrectsAfterReopen,
        TamperMissesCache,
        UsableAfterClose,
        ReusesReadBuffers,
        MixesRepeatedKeys,
        KeepsLastRepeated,
        ReplacesStored,
        LookupEvicts,
        LookupRefreshes,
        ClaimsShared,
        ScanSizesOnDisk,
        ScanListsEvicted,
        ScanIgnoresNamespace,
    )
}
