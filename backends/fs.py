"""The ``fs`` backend: one file per block on any fsspec URL.

Layout: ``<root>/<namespace>/<hex[0:2]>/<hex[2:4]>/<hex>.kvb`` where ``hex``
is the key's hex (see :mod:`kvtier.backends._fslayout`).  File names derive
from the key alone, so nothing a caller controls reaches a path.

Local roots (``file://`` or a plain absolute path) use plain ``os`` calls:
temp file + ``rename`` to publish, ``writev``/``preadv`` for the gather and
scatter hooks.  Other URLs (``memory://``, ``s3://``, ...) go through fsspec
and publish with a single ``pipe_file``.

The filesystem is the authority.  This process keeps an index (key -> size,
in LRU order) to enforce the capacity and answer lookups without a stat, but
a key missing from it is still looked for on disk, so several processes can
share one directory.  The index is rebuilt at open by walking the tree.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, MutableSequence, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn, TypeVar

from kvtier.config.units import parse_size
from kvtier.spec import (
    BackendError,
    BytesLike,
    Capabilities,
    ClosedError,
    ConfigError,
    KvtierError,
    Option,
    ScanEntry,
    hookimpl,
)

from ._batch import joined, nbytes
from ._fsindex import load_index, save_index
from ._fslayout import (
    DIRECT_MIN,
    Entry,
    LocalStore,
    RemoteStore,
    Store,
    open_store,
    run_batch,
)
from ._fsscan import scan_local, scan_remote

log = logging.getLogger("kvtier.backends.fs")

__all__ = ["FsBackend"]

T = TypeVar("T")
R = TypeVar("R")


def _check_url(value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a URL such as file:///var/cache/kv or s3://bucket/prefix")


def _check_threads(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected a whole number of threads >= 1, got {value!r}")


def _checked(check: Callable[[Any], None]) -> Callable[[Any], Any]:
    def parse(value: Any) -> Any:
        check(value)
        return value

    return parse


def _check_map(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping of fsspec keyword arguments, got {value!r}")
    return dict(value)


OPTIONS: Mapping[str, Option] = {
    "url": Option(
        "str",
        "where blocks live: file:///abs/path, /abs/path, memory://name, or any "
        "fsspec URL such as s3://bucket/prefix",
        required=True,
        check=_check_url,
    ),
    "capacity": Option(
        "size",
        "bytes of block files to keep before evicting the least recently used; unset for unbounded",
        default=None,
    ),
    "fsync": Option(
        "bool",
        "fsync each block file and its directory on publish (survives power loss, slower)",
        default=False,
    ),
    "io_threads": Option(
        "int",
        "threads running the file I/O of one batch in parallel",
        default=4,
        check=_check_threads,
    ),
    "direct_io": Option(
        "bool",
        "read blocks of 256 KiB and more that are not in the page cache with O_DIRECT "
        "on local paths: cold reads come faster and KV is not cached a second time; "
        "blocks still cached are read from the cache; filesystems that refuse "
        "O_DIRECT (tmpfs) are read through the page cache",
        default=True,
    ),
    "storage_options": Option(
        "map",
        "passed to fsspec as keyword arguments (endpoint, credentials, ...)",
        default={},
        secret=True,
    ),
}

#: How long a put waits for other threads' writes to land and free room.
_LANDING_TIMEOUT = 30.0
_NAMESPACE_RE = re.compile(r"^[0-9a-f]{32}$")
_USERINFO_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")


def _redact(url: str) -> str:
    """The URL without any ``user:password@`` part, for messages."""
    return _USERINFO_RE.sub(r"\1***@", url)


class FsBackend:
    """Blocks as files under a local directory or any fsspec URL."""

    def __init__(self) -> None:
        # No I/O here: kvtier instantiates backends just to read their options.
        self._lock = threading.Lock()
        # notified whenever writes in flight land (or fail) and give back the
        # room they reserved
        self._landed = threading.Condition(self._lock)
        self._state = "new"  # -> "open" -> "closed"
        self._store: Store = Store("")
        self._url = ""
        self._capacity: int | None = None
        self._fsync = False
        self._threads = 1
        self._pool: ThreadPoolExecutor | None = None
        # key -> stored size, least recently used first.  Guarded by _lock,
        # which is never held during I/O.
        self._index: OrderedDict[bytes, int] = OrderedDict()
        self._used = 0
        # bytes of writes in flight, counted against the capacity before they
        # land so that concurrent puts cannot overshoot it together
        self._reserved = 0
        # keys whose file is being deleted: a concurrent get that still reads
        # the file must not put them back into the index
        self._doomed: dict[bytes, int] = {}
        self._evictions = 0
        self._evicted_bytes = 0
        self._found_on_disk = 0
        self._stale_tmp_removed = 0
        # leaf directories listed again at open because the index file was
        # older than them; -1: no usable index, the whole tree was scanned
        self._leaves_rescanned = -1

    # lifecycle ------------------------------------------------------------
    @hookimpl
    def kvtier_options(self) -> Mapping[str, Option]:
        return OPTIONS  # introspection: answers before open and after close

    @hookimpl
    def kvtier_open(self, options: Mapping[str, Any], namespace: str) -> None:
        with self._lock:
            self._check_not_closed()
            if self._state == "open":
                raise RuntimeError("fs backend is already open")

        def option(name: str, parse: Callable[[Any], T]) -> T:
            # options normally arrive validated; re-checking costs nothing and
            # gives direct callers (tests, embedders) the same errors
            try:
                return parse(options.get(name, OPTIONS[name].default))
            except (TypeError, ValueError) as exc:
                raise ConfigError(str(exc), key=name) from None

        url: str = option("url", _checked(_check_url))
        self._url = _redact(url)
        if not isinstance(namespace, str) or not _NAMESPACE_RE.match(namespace):
            # it becomes a directory name: accept nothing but the documented form
            raise ConfigError(
                f"expected 32 lowercase hex digits, got {namespace!r}", key="namespace"
            )
        self._capacity = option("capacity", lambda v: None if v is None else parse_size(v))
        self._threads = option("io_threads", _checked(_check_threads))
        self._fsync = option("fsync", bool)
        store = open_store(url, option("storage_options", _check_map), namespace, self._url)
        if isinstance(store, LocalStore) and option("direct_io", bool):
            store.direct_min = DIRECT_MIN
        try:
            store.create_root()
            store.probe()
        except Exception as exc:
            raise BackendError(
                f"fs tier {self._url}: cannot create or write {store.nsroot}: {exc}"
            ) from exc
        # batches of one run inline; a pool of one thread would only add a hop
        pool = None
        if self._threads > 1:
            pool = ThreadPoolExecutor(self._threads, thread_name_prefix="kvtier-fs")
        with self._lock:
            self._store, self._pool = store, pool
        try:
            mapper = lambda fn, items: self._map(fn, items, "scan")  # noqa: E731
            # a local tier's index file spares the stat of every block (see _fsindex)
            loaded = load_index(store, mapper) if isinstance(store, LocalStore) else None
            if loaded is None:
                entries, stale = store.scan(mapper)
        except BaseException as exc:
            if pool is not None:
                pool.shutdown(wait=True)
            self._pool = None
            self._raise(exc, "scan")
        if loaded is not None:
            self._adopt(*loaded)
        else:
            self._rebuild(entries, stale)

    def _rebuild(self, entries: list[Entry], stale: int) -> None:
        # after a restart the order of use is lost: file age is the best guess
        entries.sort(key=lambda e: e.mtime)
        self._adopt(OrderedDict((e.key, e.size) for e in entries), stale, -1)

    def _adopt(self, index: OrderedDict[bytes, int], stale: int, rescanned: int) -> None:
        with self._lock:
            self._index = index
            self._used = sum(index.values())
            self._stale_tmp_removed += stale
            self._leaves_rescanned = rescanned
            self._state = "open"

    @hookimpl
    def kvtier_capabilities(self) -> Capabilities:
        with self._lock:
            if self._state != "open":
                self._check_not_closed()
                # never opened: describe a local directory, the usual case
                return Capabilities(persistent=True, shared=True, thread_safe=True,
                                    reports_evictions=True, extra={"eviction": "lru"})
        return Capabilities(
            persistent=not self._store.memory,
            shared=not self._store.memory,
            thread_safe=True,
            capacity=self._capacity,
            reports_evictions=True,
            extra={"eviction": "lru", "local": self._store.local, "io_threads": self._threads},
        )

    @hookimpl
    def kvtier_stats(self) -> Mapping[str, int | float]:
        with self._lock:
            self._check_open()
            stats: dict[str, int | float] = {
                "used_bytes": self._used,
                "blocks": len(self._index),
                "evictions": self._evictions,
                "evicted_bytes": self._evicted_bytes,
                "found_on_disk": self._found_on_disk,
                "stale_tmp_removed": self._stale_tmp_removed,
                "leaves_rescanned": self._leaves_rescanned,
            }
            if self._capacity is not None:
                stats["capacity_bytes"] = self._capacity
        return stats

    @hookimpl
    def kvtier_close(self) -> None:
        with self._lock:
            if self._state == "closed":
                return
            self._state = "closed"
            pool, self._pool = self._pool, None
            keys, sizes = list(self._index), list(self._index.values())
            self._index.clear()
        # Every block answered True was renamed into place (or piped) before
        # put returned, so nothing is left to flush; just let workers finish.
        try:
            if isinstance(self._store, LocalStore):
                self._save_index(keys, sizes, pool)
        finally:
            if pool is not None:
                pool.shutdown(wait=True)

    def _save_index(self, keys: list[bytes], sizes: list[int],
                    pool: ThreadPoolExecutor | None) -> None:
        """Leave the index for the next open; a failure only costs that open a full scan."""
        assert isinstance(self._store, LocalStore)

        def mapper(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
            if pool is None or len(items) <= 1:
                return [fn(x) for x in items]
            return run_batch(pool, self._threads, fn, items)

        try:
            save_index(self._store, keys, sizes, mapper, self._fsync)
        except OSError as exc:
            log.warning("fs tier %s: index not saved (%s); the next open scans the tree",
                        self._url, exc)

    def _check_not_closed(self) -> None:
        if self._state == "closed":
            raise ClosedError("fs backend is closed")

    def _check_open(self) -> None:
        if self._state != "open":
            state = "closed" if self._state == "closed" else "not open"
            raise ClosedError(f"fs backend is {state}")

    # data path ------------------------------------------------------------
    @hookimpl
    def kvtier_put(
        self,
        keys: Sequence[bytes],
        blocks: Sequence[BytesLike],
        evicted: MutableSequence[tuple[bytes, BytesLike]],
    ) -> Sequence[bool]:
        sizes = [b.nbytes if isinstance(b, memoryview) else len(b) for b in blocks]
        return self._put(keys, [(b,) for b in blocks], sizes, evicted)

    @hookimpl
    def kvtier_put_parts(
        self,
        keys: Sequence[bytes],
        parts: Sequence[Sequence[BytesLike]],
        evicted: MutableSequence[tuple[bytes, BytesLike]],
    ) -> Sequence[bool]:
        sizes = [sum(map(nbytes, ps)) for ps in parts]
        return self._put(keys, parts, sizes, evicted)

    def _put(
        self,
        keys: Sequence[bytes],
        parts: Sequence[Sequence[BytesLike]],
        sizes: list[int],
        evicted: MutableSequence[tuple[bytes, BytesLike]],
    ) -> list[bool]:
        if len(keys) == 1 and self._put_one(keys[0], parts[0], sizes[0]):
            return [True]
        with self._lock:
            if self._state != "open":
                self._check_open()
            results, plan, victims, first = self._plan(keys, sizes)
        if not plan and not victims:
            # all stored already (or refused): nothing to write, no second lock
            if first is not None:
                for i, key in enumerate(keys):
                    results[i] = results[first[key]]
            return results
        store, fsync = self._store, self._fsync

        def write(i: int) -> int | Exception:
            # caught per block so that the blocks that did land get indexed
            try:
                return store.write(keys[i], parts[i], fsync)
            except Exception as exc:
                return exc

        try:
            if victims:
                self._report_victims(victims, parts, evicted)
            outcomes = self._map(write, plan, "write block")
        except BaseException:
            with self._lock:
                self._reserved -= sum(sizes[i] for i in plan)
                self._landed.notify_all()
            raise
        failure: Exception | None = None
        with self._lock:
            for i, out in zip(plan, outcomes, strict=True):
                self._reserved -= sizes[i]
                if isinstance(out, int):
                    self._admit(keys[i], out)
                else:
                    results[i] = False
                    failure = failure or out
            self._landed.notify_all()
        if failure is not None:
            self._raise(failure, "write block")
        if first is not None:
            for i, key in enumerate(keys):
                results[i] = results[first[key]]
        return results

    def _put_one(self, key: bytes, parts: Sequence[BytesLike], size: int) -> bool:
        """A single block that needs no eviction, with the least bookkeeping.

        Small blocks cost a few syscalls; the general path's planning would
        add a noticeable share to that.  Answers False to hand over to it.
        """
        with self._lock:
            if self._state != "open":
                self._check_open()
            if key in self._index:
                self._index.move_to_end(key)
                return True
            cap = self._capacity
            if cap is not None and self._used + self._reserved + size > cap:
                return False
            self._reserved += size
        try:
            stored = self._store.write(key, parts, self._fsync)
        except BaseException as exc:
            with self._lock:
                self._reserved -= size
                self._landed.notify_all()
            self._raise(exc, "write block")
        with self._lock:
            self._reserved -= size
            self._admit(key, stored)
            self._landed.notify_all()
        return True

    def _plan(
        self, keys: Sequence[bytes], sizes: list[int]
    ) -> tuple[list[bool], list[int], list[tuple[bytes, int | None]], dict[bytes, int] | None]:
        """Decide, under the lock, what a put writes and what it evicts.

        Answers the provisional results, the batch positions to write, the
        victims in eviction order -- ``(key, None)`` for a stored block,
        ``(key, i)`` for a block of this batch pushed out by a later one before
        it was written -- and, for a batch with repeated keys, each key's first
        position.  Space for the writes is reserved until they land, so that
        concurrent puts cannot overshoot the capacity together.
        """
        n = len(keys)
        results = [False] * n
        index, cap = self._index, self._capacity
        first: dict[bytes, int] | None = None
        if n > 1:
            first = {}
            for i, key in enumerate(keys):
                first.setdefault(key, i)
            if len(first) == n:
                first = None  # no repeats: skip the fix-up at the end
        plan: list[int] = []
        head = 0  # plan[:head] were pushed out again by later blocks
        victims: list[tuple[bytes, int | None]] = []
        for i, key in enumerate(keys):
            if first is not None and first[key] != i:
                continue
            if key in index:
                index.move_to_end(key)
                results[i] = True
                continue
            size = sizes[i]
            if cap is not None:
                if size > cap:
                    continue
                # Same outcome as putting the batch one block at a time: the
                # least recently used go first, earlier blocks of this batch last.
                over = self._used + self._reserved + size - cap
                while over > 0:
                    if index:
                        vkey, vsize = index.popitem(last=False)
                        self._used -= vsize
                        self._doomed[vkey] = self._doomed.get(vkey, 0) + 1
                        victims.append((vkey, None))
                    elif head < len(plan):
                        vi = plan[head]
                        head += 1
                        vsize = sizes[vi]
                        self._reserved -= vsize
                        victims.append((keys[vi], vi))
                    elif self._reserved and self._state == "open":
                        # The rest is held by other threads' writes in flight
                        # (this batch's own are given back above).  Once they
                        # land they can be evicted like any block; refusing
                        # now would turn a block that fits into a False.
                        # Batches waiting here hold no reservation, so they
                        # never wait for each other.
                        if not self._landed.wait(_LANDING_TIMEOUT):
                            break
                        over = self._used + self._reserved + size - cap
                        continue
                    else:
                        break
                    over -= vsize
                if over > 0:
                    continue
            plan.append(i)
            self._reserved += size
            results[i] = True
        self._evictions += len(victims)
        return results, plan[head:], victims, first

    def _report_victims(
        self,
        victims: list[tuple[bytes, int | None]],
        parts: Sequence[Sequence[BytesLike]],
        evicted: MutableSequence[tuple[bytes, BytesLike]],
    ) -> None:
        stored = [key for key, i in victims if i is None]
        total = 0
        try:
            # Every victim is read and reported before any is deleted: a chain
            # takes a reported block as on its way to the tier below at once,
            # so a concurrent reader finds it here or there, never nowhere.
            found = iter(self._map(self._store.read, stored, "evict"))
            for key, i in victims:
                data = next(found) if i is None else joined(parts[i])
                if data is not None:  # None: another process deleted it first
                    evicted.append((key, data))
                    total += len(data)
            self._map(self._store.remove, stored, "evict")
        finally:
            with self._lock:
                self._undoom(stored)
                self._evicted_bytes += total

    @hookimpl
    def kvtier_get(self, keys: Sequence[bytes]) -> Sequence[BytesLike | None]:
        if len(keys) == 1:  # the common case, without the batch machinery
            hit = self._touch(keys)[0]
            try:
                data = self._store.read(keys[0])
            except BaseException as exc:
                self._raise(exc, "read block")
            if hit is (data is None):
                self._reconcile(keys, [hit], [None if data is None else len(data)])
            return [data]
        unique = keys if len(keys) <= 1 else list(dict.fromkeys(keys))
        known = self._touch(unique)
        found = self._map(self._store.read, unique, "read block")
        self._reconcile(unique, known, [None if d is None else len(d) for d in found])
        if unique is keys:
            return found
        by_key = dict(zip(unique, found, strict=True))
        return [by_key[key] for key in keys]

    @hookimpl
    def kvtier_get_into(
        self, keys: Sequence[bytes], buffers: Sequence[Sequence[memoryview]]
    ) -> Sequence[int | None]:
        if len(keys) == 1:  # the common case, without the batch machinery
            hit = self._touch(keys)[0]
            try:
                size = self._store.read_into(keys[0], buffers[0])
            except BaseException as exc:
                self._raise(exc, "read block")
            if hit is (size is None):
                self._reconcile(keys, [hit], [size])
            return [size]
        # no de-duplication: every position has buffers of its own to fill
        known = self._touch(keys)
        read_into = self._store.read_into
        sizes = self._map(lambda i: read_into(keys[i], buffers[i]), range(len(keys)), "read")
        self._reconcile(keys, known, sizes)
        return sizes

    @hookimpl
    def kvtier_lookup(self, keys: Sequence[bytes]) -> Sequence[bool]:
        with self._lock:
            if self._state != "open":
                self._check_open()
            index = self._index
            known = [key in index for key in keys]
        if all(known):
            return known
        # the index may lag behind other processes: stat what it lacks
        unknown = list(dict.fromkeys(k for k, hit in zip(keys, known, strict=True) if not hit))
        sizes = self._map(self._store.size, unknown, "stat block")
        self._reconcile(unknown, [False] * len(unknown), sizes)
        found = {key for key, size in zip(unknown, sizes, strict=True) if size is not None}
        return [hit or key in found for key, hit in zip(keys, known, strict=True)]

    @hookimpl
    def kvtier_evict(self, keys: Sequence[bytes]) -> Sequence[bool]:
        unique = list(dict.fromkeys(keys))
        with self._lock:
            if self._state != "open":
                self._check_open()
            for key in unique:
                size = self._index.pop(key, None)
                if size is not None:
                    self._used -= size
                self._doomed[key] = self._doomed.get(key, 0) + 1
        try:
            # unlink even keys this process never saw: another may have written them
            removed = self._map(self._store.remove, unique, "evict block")
        finally:
            with self._lock:
                self._undoom(unique)
        first = dict(zip(unique, removed, strict=True))
        out = []
        for key in keys:
            out.append(first[key])
            first[key] = False  # a repeated key was removed by its first mention
        return out

    # operators ------------------------------------------------------------
    @hookimpl
    def kvtier_scan(self, namespace: str | None) -> Iterator[list[ScanEntry]]:
        with self._lock:
            self._check_open()
        if namespace is not None and not _NAMESPACE_RE.match(namespace):
            raise ConfigError(f"expected 32 lowercase hex digits, got {namespace!r}",
                              key="namespace")
        store = self._store
        root = store.nsroot.rsplit("/", 1)[0]  # the namespaces' parent: the tier's URL

        def check() -> None:
            with self._lock:
                self._check_open()

        if isinstance(store, RemoteStore):
            batches = scan_remote(store.fs, root, namespace, check)
        else:
            batches = scan_local(root, namespace, check)
        return self._faults_as_backend_errors(batches)

    def _faults_as_backend_errors(
        self, batches: Iterator[list[ScanEntry]]
    ) -> Iterator[list[ScanEntry]]:
        try:
            yield from batches
        except BaseException as exc:
            self._raise(exc, "scan")

    # testing --------------------------------------------------------------
    @hookimpl
    def kvtier_tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        with self._lock:
            self._check_open()
        try:
            data = self._store.read(key)
            # raw rewrite in place, index untouched: like bit rot or a torn write
            return data is not None and self._store.rewrite(key, transform(data))
        except BaseException as exc:
            self._raise(exc, "tamper")

    # helpers --------------------------------------------------------------
    def _touch(self, keys: Sequence[bytes]) -> list[bool]:
        """Mark indexed keys as just used; answer which were indexed."""
        known = []
        with self._lock:
            if self._state != "open":
                self._check_open()
            index = self._index
            for key in keys:
                if key in index:
                    index.move_to_end(key)
                    known.append(True)
                else:
                    known.append(False)
        return known

    def _reconcile(
        self, keys: Sequence[bytes], known: list[bool], sizes: Sequence[int | None]
    ) -> None:
        """Bring the index in line with what the store answered, where they disagree."""
        for hit, size in zip(known, sizes, strict=True):
            if hit is (size is None):
                break
        else:
            return  # the common case: no second trip through the lock
        with self._lock:
            for key, hit, size in zip(keys, known, sizes, strict=True):
                if size is None:
                    # deleted by another process: a miss, and no longer counted
                    if hit and key in self._index:
                        self._used -= self._index.pop(key)
                elif key not in self._index and key not in self._doomed:
                    # Written by another process.  Counting it may overshoot
                    # the capacity; the next put evicts back under it (and
                    # reports what it evicts, which a get could not).
                    self._admit(key, size)
                    self._found_on_disk += 1

    def _admit(self, key: bytes, size: int) -> None:
        if key in self._index:
            self._index.move_to_end(key)
        else:
            self._index[key] = size
            self._used += size

    def _undoom(self, keys: Sequence[bytes]) -> None:
        for key in keys:
            left = self._doomed.pop(key) - 1
            if left:
                self._doomed[key] = left

    def _map(self, fn: Callable[[T], R], items: Sequence[T], what: str) -> list[R]:
        """``[fn(x) for x in items]``, spread over the I/O threads for a batch.

        Workers pull the next item from a shared counter, so one slow file
        does not hold up a fixed share of the batch; the calling thread works
        too instead of just waiting.  Faults surface as BackendError after
        every item has finished, so no I/O of the batch is left running.
        """
        try:
            pool = self._pool
            if len(items) <= 1 or pool is None:
                return [fn(x) for x in items]
            return run_batch(pool, self._threads, fn, items)
        except BaseException as exc:
            self._raise(exc, what)

    def _raise(self, exc: BaseException, what: str) -> NoReturn:
        """Raise ``exc``, as a BackendError naming the tier if it is a storage fault."""
        if isinstance(exc, KvtierError) or not isinstance(exc, Exception):
            raise exc
        if isinstance(exc, OSError):
            detail = exc.strerror or str(exc)
            if exc.filename:
                detail = f"{detail}: {exc.filename}"
            message = f"fs tier {self._url}: {what}: {detail}"
            err = BackendError(exc.errno, message) if exc.errno else BackendError(message)
            raise err from exc
        if self._store.local:
            raise exc  # not a storage fault but a bug: let it show as such
        # remote filesystems raise their own types for network trouble
        raise BackendError(f"fs tier {self._url}: {what}: {exc!r}") from exc
