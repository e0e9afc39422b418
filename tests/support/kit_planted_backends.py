"""More broken variants of :class:`~kit_broken_backends.DictBackend`, and a shared reference.

The mistakes an author made on purpose in a backend written from the guide,
each of which passed every check of the kit before the kit learnt to catch
it: uses that refresh nothing, an ``evictions`` figure that stays 0, one byte
count for every namespace, recency kept at class level, a close that closes
the store for every instance, writes all in native code, a bad option that
raises a plain ``ValueError``.  :class:`SharedDict` is a correct backend that
declares ``shared=True`` (instances of one namespace share blocks and one
capacity), so that :class:`CapacityPerInstance` has a reference to break.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import secrets
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, MutableSequence
from typing import Any, ClassVar

from kit_broken_backends import DictBackend

from kvtier.spec import BytesLike, Capabilities, ClosedError, hookimpl

Evicted = MutableSequence[tuple[bytes, BytesLike]]


class GetIsNoUse(DictBackend):
    """A get does not refresh recency: the oldest block goes next even if it was just read."""

    def _read(self, key: bytes) -> BytesLike | None:
        return self._blocks.get(key)


class StoredPutIsNoUse(DictBackend):
    """A put of a stored key answers True and refreshes nothing."""

    @hookimpl
    def kvtier_put(
        self, keys: list[bytes], blocks: list[BytesLike], evicted: Evicted
    ) -> list[bool]:
        with self._guard():
            stored = [key in self._blocks for key in keys]
        out = super().kvtier_put([k for k, s in zip(keys, stored) if not s],
                                 [b for b, s in zip(blocks, stored) if not s], evicted)
        answers = iter(out)
        return [True if s else next(answers) for s in stored]


class ScanRefreshes(DictBackend):
    """A scan lists the newest blocks first and reads each through the read path, which
    counts it as a use: the oldest block ends up the most recently used."""

    def _listing(self, namespace: str | None) -> list[Any]:
        for key in reversed(list(self._blocks)):
            self._touch(key)
        return super()._listing(namespace)


class ReportsEvictedLater(DictBackend):
    """evict defers its deletions, and the next put reports them in ``evicted``."""

    def __init__(self) -> None:
        super().__init__()
        self._removed: list[tuple[bytes, BytesLike]] = []

    def _remove(self, key: bytes) -> bool:
        data = self._blocks.get(key)
        if data is not None:
            self._removed.append((key, data))
        return super()._remove(key)

    def _make_room(self, size: int, evicted: Evicted) -> None:
        evicted.extend(self._removed)
        self._removed.clear()
        super()._make_room(size, evicted)


class EvictionsStayZero(DictBackend):
    """Its ``evictions`` figure counts kvtier_evict's removals, so it stays 0 while the
    capacity pushes blocks out."""

    def __init__(self) -> None:
        super().__init__()
        self._removed = 0

    def _remove(self, key: bytes) -> bool:
        removed = super()._remove(key)
        self._removed += removed
        return removed

    @hookimpl
    def kvtier_stats(self) -> Mapping[str, int]:
        return {**super().kvtier_stats(), "evictions": self._removed}


class CountsEveryNamespace(DictBackend):
    """Reports one ``used_bytes`` for the whole store: every open instance's bytes together."""

    _live: ClassVar[weakref.WeakSet[DictBackend]] = weakref.WeakSet()

    @hookimpl
    def kvtier_open(self, options: Mapping[str, Any], namespace: str) -> None:
        super().kvtier_open(options, namespace)
        self._live.add(self)

    @hookimpl
    def kvtier_stats(self) -> Mapping[str, int]:
        stats = dict(super().kvtier_stats())
        stats["used_bytes"] = sum(i._used for i in list(self._live) if i._state == "open")
        return stats


class ClassLevelRecency(DictBackend):
    """Keeps its LRU order in a class attribute, one for every instance, keyed by key alone."""

    _order: ClassVar[OrderedDict[bytes, None]] = OrderedDict()

    def _touch(self, key: bytes) -> None:
        super()._touch(key)
        self._order[key] = None
        self._order.move_to_end(key)

    def _insert(self, key: bytes, data: BytesLike) -> None:
        super()._insert(key, data)
        self._touch(key)

    def _make_room(self, size: int, evicted: Evicted) -> None:
        while self._capacity is not None and self._used + size > self._capacity:
            # blocks a reopen loaded were never touched: they are the oldest
            unseen = (k for k in self._blocks if k not in self._order)
            key = next(unseen, None) or next(k for k in self._order if k in self._blocks)
            data = self._blocks.pop(key)
            self._used -= len(memoryview(data).cast("B"))
            self._unlink(key)
            self._evictions += 1
            self._report(evicted, key, data)


class _Environment:
    def __init__(self) -> None:
        self.closed = False


class CloseClosesAll(DictBackend):
    """Opens one environment per location for the whole process (as LMDB does), and close
    closes it: every other instance on the location is dead from then on."""

    _environments: ClassVar[dict[str, _Environment]] = {}

    @hookimpl
    def kvtier_open(self, options: Mapping[str, Any], namespace: str) -> None:
        super().kvtier_open(options, namespace)
        where = str(options.get("dir") or "memory")
        self._env = self._environments.setdefault(where, _Environment())
        self._where = where

    @hookimpl
    def kvtier_close(self) -> None:
        super().kvtier_close()
        env = getattr(self, "_env", None)
        if env is not None:
            env.closed = True
            self._environments.pop(self._where, None)

    def _check_open(self) -> None:
        super()._check_open()
        if self._env.closed:
            raise ClosedError("dict backend's environment is closed")


_LIBC = ctypes.CDLL(None, use_errno=True)


class NativeWrites(DictBackend):
    """Writes its files through libc (as a native store commits in C): correct and
    crash-safe, but the every-step crash test sees none of its I/O calls."""

    def _write(self, key: bytes, data: BytesLike) -> None:
        if self._dir is None:
            return
        path = self._path(key)
        tmp = f"{path}.{secrets.token_hex(4)}.tmp".encode()
        raw = bytes(data)
        fd = _LIBC.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "open failed")
        try:
            done = 0
            while done < len(raw):
                chunk = raw[done:]
                wrote = _LIBC.write(fd, chunk, len(chunk))
                if wrote < 0:
                    raise OSError(ctypes.get_errno(), "write failed")
                done += wrote
        finally:
            _LIBC.close(fd)
        if _LIBC.rename(tmp, str(path).encode()) != 0:
            raise OSError(ctypes.get_errno(), "rename failed")

    def _unlink(self, key: bytes) -> None:
        if self._dir is not None:
            _LIBC.unlink(str(self._path(key)).encode())


class DeclaresNativeWrites(NativeWrites):
    """NativeWrites that says so: correct, and the kit must certify it, skipping the
    every-step crash test with this reason (the random-instants one still runs)."""

    kit_native_writes = "every file is written and renamed by libc, called through ctypes"


class BlankNativeWrites(NativeWrites):
    """Declares native writes without saying why: a declaration the kit refuses."""

    kit_native_writes = " "


class RefusesWithValueError(DictBackend):
    """Refuses a bad ``scan_batch`` with a plain ValueError, which names no option."""

    def _check_scan_batch(self, value: int) -> int:
        if value < 1:
            raise ValueError(f"scan_batch must be at least 1, got {value}")
        return value


@dataclasses.dataclass
class _Shared:
    blocks: OrderedDict[bytes, BytesLike] = dataclasses.field(default_factory=OrderedDict)
    used: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class SharedDict(DictBackend):
    """Correct, in memory, and shared: the instances of one namespace in this process share
    their blocks, their lock and one capacity."""

    _stores: ClassVar[dict[str, _Shared]] = {}
    _stores_lock: ClassVar[threading.Lock] = threading.Lock()

    @hookimpl
    def kvtier_open(self, options: Mapping[str, Any], namespace: str) -> None:
        self._check_not_closed()
        self._capacity = options.get("capacity")
        self._namespace = namespace
        with self._stores_lock:
            self._shared = self._stores.setdefault(namespace, _Shared())
        self._blocks, self._lock = self._shared.blocks, self._shared.lock
        self._state = "open"

    @hookimpl
    def kvtier_capabilities(self) -> Capabilities:
        caps = super().kvtier_capabilities()
        return dataclasses.replace(caps, shared=True)

    @hookimpl
    def kvtier_close(self) -> None:
        self._state = "closed"  # the blocks belong to the namespace, not to this instance

    @property  # type: ignore[override]
    def _used(self) -> int:
        shared = self.__dict__.get("_shared")
        return shared.used if shared is not None else 0

    @_used.setter
    def _used(self, value: int) -> None:
        shared = self.__dict__.get("_shared")
        if shared is not None:
            shared.used = value


class CapacityPerInstance(SharedDict):
    """Shares its blocks but counts the capacity per instance: two instances hold twice it."""

    @property  # type: ignore[override]
    def _used(self) -> int:
        return int(self.__dict__.get("_mine", 0))

    @_used.setter
    def _used(self, value: int) -> None:
        self.__dict__["_mine"] = max(0, value)

    def _make_room(self, size: int, evicted: Evicted) -> None:
        # evicts only what it put itself, by its own count
        while self._capacity is not None and self._used + size > self._capacity:
            mine = self.__dict__.setdefault("_put", set())
            key = next((k for k in self._blocks if k in mine), None)
            if key is None:
                self._used = 0
                return
            mine.discard(key)
            data = self._blocks.pop(key)
            self._used -= len(memoryview(data).cast("B"))
            self._evictions += 1
            self._report(evicted, key, data)

    def _insert(self, key: bytes, data: BytesLike) -> None:
        super()._insert(key, data)
        self.__dict__.setdefault("_put", set()).add(key)


#: Every planted variant, by name (SharedDict is correct: the kit must pass it).
PLANTED: dict[str, type[DictBackend]] = {
    cls.__name__: cls
    for cls in (
        GetIsNoUse,
        StoredPutIsNoUse,
        ScanRefreshes,
        ReportsEvictedLater,
        EvictionsStayZero,
        CountsEveryNamespace,
        ClassLevelRecency,
        CloseClosesAll,
        NativeWrites,
        RefusesWithValueError,
        CapacityPerInstance,
    )
}
