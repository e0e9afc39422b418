"""The ``fs`` backend: one file per block on any fsspec URL.

Layout: ``<root>/<namespace>/<hex[0:2]>/<hex[2:4]>/<hex>.kvb`` where ``hex``
is the key's hex (see :mod:`kvtier.backends.fs.layout`).  File names derive
from the key alone, so nothing a caller controls reaches a path.

Local roots (``file://`` or a plain absolute path) use plain ``os`` calls:
temp file + ``rename`` to publish, ``writev``/``preadv`` for the gather and
scatter hooks (:mod:`kvtier.backends.fs.local`; large reads bypass the page
cache, :mod:`kvtier.backends.fs.direct`).  Other URLs (``memory://``,
``s3://``, ...) go through fsspec and publish with a single ``pipe_file``
(:mod:`kvtier.backends.fs.remote`).

The filesystem is the authority.  This process keeps an index (key -> size,
in the order of its ``eviction`` policy, :mod:`.capacity`) to enforce the
capacity and answer lookups without a stat, but a key missing from it is still
looked for on disk, so several processes can share one directory.  The index
is rebuilt at open from the file a local tier leaves at close (:mod:`.index`),
or by walking the tree.  On a local root opened with ``capacity`` or
``min_free`` a shared index keeps the bounds instead (:mod:`.pool`), one for
every process on the root; this process's index then only answers lookups.
Either way the backend calls one interface, :class:`.room.Capacity`.

The rest of the package: :mod:`.options` declares the options, :mod:`.open`
picks the store a URL gets, :mod:`.faults` tells a block's fault from the
tier's, :mod:`.scan` lists the blocks for ``kvtier_scan``, :mod:`.readonly` is
a root opened to be read, writing nothing, :mod:`.expiry` does ``expire`` and deadlines.
:func:`kvtier.spec.run_batch` spreads a batch over the I/O threads.  Online
sizing sees this process's gets and puts (under a pool, its own traffic).

May import :mod:`kvtier.policies`, :mod:`kvtier.block`, :mod:`kvtier.config`,
:mod:`kvtier.plugins` and :mod:`kvtier.spec`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn, TypeVar, cast

from kvtier.block.buffers import joined, parts_nbytes
from kvtier.policies.sizing import Sizing
from kvtier.spec import (
    BackendError,
    BytesLike,
    Capabilities,
    CapacityScope,
    ConfigError,
    Failed,
    KvtierError,
    ScanEntry,
    map_batch,
    run_batch,
)
from kvtier.spec.base import Evicted, GetInto, PutParts, Scan

from .capacity import Ledger, Victim
from .direct import DIRECT_MIN
from .expiry import Deadlines, Expirer
from .faults import BlockFaults
from .index import load_tree, save_or_warn
from .layout import NAMESPACE_RE, Store
from .local import LocalStore
from .open import open_store, redact
from .options import OPTIONS
from .pool_capacity import KeepMarks, open_capacity
from .readonly import ReadOnlyStore
from .room import Capacity, ProcessCapacity
from .scan import scan_store

log = logging.getLogger("kvtier.backends.fs")

__all__ = ["FsBackend"]

T = TypeVar("T")
R = TypeVar("R")


class FsBackend(PutParts, GetInto, Scan, KeepMarks, Deadlines):
    """Blocks as files under a local directory or any fsspec URL.

    The lifecycle, batch checks and repeated keys are :class:`BlockStore`'s;
    the data path checks the state again under ``_lock``, with the index.
    """

    name = "fs"
    OPTIONS = OPTIONS

    def __init__(self) -> None:
        # No I/O here: kvtier instantiates backends just to read their options.
        super().__init__()
        self._lock = threading.Lock()  # never held during I/O
        self._store: Store = Store("")
        self._url = ""
        self._fsync = False
        self._threads = 1
        self._pool: ThreadPoolExecutor | None = None
        # what the tier holds and what puts reserved, guarded by _lock
        self._ledger = Ledger(self._lock)
        self._stale_tmp_removed = 0
        # leaf directories listed again at open because the index file was
        # older than them; -1: no usable index, the whole tree was scanned
        self._leaves_rescanned = -1
        self._faults = BlockFaults()  # see .faults: a block's fault is a miss
        # this process's gets and puts (under a shared pool too: its own traffic)
        self._sizing = Sizing()
        self._eviction = "lru"  # the option: the pool's order, or the ledger's
        # what bounds the bytes (.room): this process's count, or the shared pool's
        self._capacity: Capacity = ProcessCapacity(self._store, None)
        self._ns = ""

    # lifecycle ------------------------------------------------------------
    def _open(self, options: Mapping[str, Any], namespace: str) -> None:
        # options arrive checked against OPTIONS, defaults filled (BackendHandle.open)
        url: str = options["url"]
        self._url = self._faults.url = redact(url)
        if not isinstance(namespace, str) or not NAMESPACE_RE.match(namespace):
            # it becomes a directory name: accept nothing but the documented form
            raise ConfigError(
                f"expected 32 lowercase hex digits, got {namespace!r}", key="namespace"
            )
        read_only = options["read_only"]  # see .readonly: nothing written under the root
        self._threads = options["io_threads"]
        self._fsync = options["fsync"]
        store = open_store(url, options["storage_options"], namespace, self._url,
                           options["create"] and not read_only)
        if isinstance(store, LocalStore) and options["direct_io"]:
            store.direct_min = DIRECT_MIN
        store = ReadOnlyStore(store, self._url) if read_only else store
        self._expirer = Expirer(store, options, self._evict, self._deadline_pool)  # .expiry
        try:
            store.create_root()
            store.probe()
            capacity = open_capacity(store, options, namespace)  # shared or not: .room
        except KvtierError:
            raise  # the pool's own: another eviction policy on the root
        except Exception as exc:
            raise BackendError(
                f"fs tier {self._url}: cannot create or write {store.nsroot}: {exc}"
            ) from exc
        # batches of one run inline; a pool of one thread would only add a hop
        pool = None
        if self._threads > 1:
            pool = ThreadPoolExecutor(self._threads, thread_name_prefix="kvtier-fs")
        with self._lock:
            self._store, self._pool, self._capacity, self._ns = store, pool, capacity, namespace
        try:
            mapper = lambda fn, items: self._map(fn, items, "scan")  # noqa: E731
            found = load_tree(store, mapper)
            capacity.adopt(found[0], self._ledger)  # before the ledger's own adopt
        except BaseException as exc:
            if pool is not None:
                pool.shutdown(wait=True)
            self._pool = None
            capacity.close()
            self._raise(exc, "scan")
        self._eviction = options["eviction"]
        index, stale, rescanned = found
        with self._lock:
            self._ledger.adopt(index, self._eviction)
            self._stale_tmp_removed += stale
            self._leaves_rescanned = rescanned
        self._sizing.start(capacity.limit, options["sizing_sample"], eviction=self._eviction)

    def _capabilities(self) -> Capabilities:
        with self._lock:
            if not self.is_open:
                # never opened: describe a local directory, the usual case
                return Capabilities(persistent=True, shared=True, thread_safe=True,
                                    reports_evictions=True, eviction="lru")
        return Capabilities(
            persistent=not self._store.memory,
            shared=not self._store.memory,
            thread_safe=True,
            capacity=self._capacity.limit,
            reports_evictions=True,
            eviction=self._eviction,
            capacity_scope=cast(CapacityScope, self._capacity.scope),  # checked by its Option
            extra={"local": self._store.local, "io_threads": self._threads},
        )

    def _stats(self) -> Mapping[str, int | float]:
        with self._lock:
            self.ensure_open()
            ledger = self._ledger
            stats: dict[str, int | float] = {
                "used_bytes": ledger.used,
                "blocks": len(ledger.index),
                "evictions": ledger.evictions,
                "evicted_bytes": ledger.evicted_bytes,
                "found_on_disk": ledger.found_on_disk,
                "stale_tmp_removed": self._stale_tmp_removed,
                "leaves_rescanned": self._leaves_rescanned,
                "block_faults": self._faults.count,
            }
            if ledger.capacity is not None:
                stats["capacity_bytes"] = ledger.capacity
        stats.update(self._capacity.stats())  # the pool's truth, where one counts
        stats.update(self._sizing.stats(), **self._expirer.stats())
        return stats

    def _close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            index = self._ledger.index
            keys, sizes = list(index), list(index.values())
            index.clear()
        # Every block answered True was renamed into place (or piped) before
        # put returned, so nothing is left to flush; just let workers finish.
        try:
            # for the next open: spares it a scan; under a pool, written by the last process
            # of the namespace to close (its bytes count in the capacity: .pool_files)
            if isinstance(self._store, LocalStore) and self._capacity.snapshot_at_close():
                save_or_warn(self._store, keys, sizes, self._fsync, self._url,
                             lambda fn, items: run_batch(pool, self._threads, fn, items))
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
            self._capacity.close()

    def _is_open(self) -> bool:
        return self.is_open

    # data path ------------------------------------------------------------
    def _put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> Sequence[bool]:
        sizes = [b.nbytes if isinstance(b, memoryview) else len(b) for b in blocks]
        stored = self._write_blocks(keys, [(b,) for b in blocks], sizes, evicted)
        self._sizing.stored(keys, sizes)
        return stored

    def _put_parts(
        self, keys: Sequence[bytes], parts: Sequence[Sequence[BytesLike]], evicted: Evicted
    ) -> Sequence[bool]:
        sizes = [parts_nbytes(ps) for ps in parts]  # a frame is sealed in its I/O thread
        stored = self._write_blocks(keys, parts, sizes, evicted)
        self._sizing.stored(keys, sizes)
        return stored

    def _write_blocks(self, keys: Sequence[bytes], parts: Sequence[Sequence[BytesLike]],
                      sizes: list[int], evicted: Evicted) -> list[bool]:
        if isinstance(self._store, ReadOnlyStore):
            return [False] * len(keys)
        self._expirer.sweep()  # expired blocks leave before new ones take room
        capacity = self._capacity
        if len(keys) == 1 and not capacity.shared:  # the ledger alone decides
            done = self._put_one(keys[0], parts[0], sizes[0])
            if done is not None:
                return [done]
        ledger = self._ledger
        with self._lock:
            if not self.is_open:
                raise self.closed_error()
            results, plan, victims, first = ledger.plan(keys, sizes, self._is_open)
        if capacity.shared:  # a put of a stored key is a use, as a get
            again = set(range(len(keys))).difference(plan)
            capacity.used([keys[i] for i in sorted(again) if results[i]])
        if not plan and not victims:
            # all stored already (or refused): nothing to write, no second lock
            if first is not None:
                for i, key in enumerate(keys):
                    results[i] = results[first[key]]
            return results
        if capacity.shared:
            plan = self._place(keys, parts, sizes, plan, results, evicted)
        store, fsync, settle = self._store, self._fsync, capacity.landed

        def write(i: int) -> int:
            try:
                size = store.write(keys[i], parts[i], fsync)
            except BaseException:
                settle(keys[i], None)  # the room it took is given back
                raise
            settle(keys[i], size)
            return size

        try:
            if victims:
                self._report_victims(victims, parts, evicted)
            # caught per block so that the blocks that did land get indexed
            outcomes = map_batch(self._pool, self._threads, write, plan)
        except BaseException as exc:
            with self._lock:
                ledger.release(sum(sizes[i] for i in plan))
            self._raise(exc, "write block")
        failure: BaseException | None = None
        try:
            landed, _ = self._faults.settle(outcomes, -1, store.probe, "write block")
        except BaseException as exc:  # the tier's fault: raised once the landed are indexed
            failure = exc
            landed = [out if isinstance(out, int) else -1 for out in outcomes]
        with self._lock:
            for i, size in zip(plan, landed, strict=True):
                ledger.reserved -= sizes[i]
                if size >= 0:
                    ledger.admit(keys[i], size)
                else:
                    results[i] = False
            ledger.landed.notify_all()
        if failure is not None:
            self._raise(failure, "write block")
        if first is not None:
            for i, key in enumerate(keys):
                results[i] = results[first[key]]
        return results

    def _put_one(self, key: bytes, parts: Sequence[BytesLike], size: int) -> bool | None:
        """A single block that needs no eviction, with the least bookkeeping.

        Small blocks cost a few syscalls; the general path's planning would
        add a noticeable share to that.  Answers None to hand over to it.
        """
        ledger = self._ledger
        with self._lock:
            if not self.is_open:
                raise self.closed_error()
            if key in ledger.index:
                ledger.use(key)
                return True
            cap = ledger.capacity
            if cap is not None and ledger.used + ledger.reserved + size > cap:
                return None
            if key in ledger.doomed:
                return None  # its file is being deleted: the general path waits for that
            ledger.reserved += size
        try:
            stored = self._store.write(key, parts, self._fsync)
        except BaseException as exc:
            with self._lock:
                ledger.release(size)
            self._one(exc, False, self._store.probe, "write block")
            return False
        with self._lock:
            ledger.release(size)
            ledger.admit(key, stored)
        return True

    def _place(
        self, keys: Sequence[bytes], parts: Sequence[Sequence[BytesLike]], sizes: list[int],
        plan: list[int], results: list[bool], evicted: Evicted,
    ) -> list[int]:
        """Take room in a shared capacity (:mod:`.room`) for the blocks ``plan`` writes;
        answer those to write.  A block refused is False, one the pool holds is True."""
        verdicts = self._capacity.reserve([keys[i] for i in plan], [sizes[i] for i in plan],
                                          lambda victims: self._drop(victims, evicted))
        kept = []
        with self._lock:
            for i, verdict in zip(plan, verdicts, strict=True):
                if verdict == "new":
                    kept.append(i)
                    continue
                self._ledger.release(sizes[i])
                results[i] = verdict in ("have", "pushed")
                if verdict == "pushed":  # stored and evicted at once: reported like one
                    evicted.append((keys[i], joined(parts[i])))
                    self._ledger.evictions += 1
                elif results[i]:
                    self._ledger.admit(keys[i], sizes[i])
        return kept

    def _drop(self, victims: list[tuple[str, bytes]], evicted: Evicted) -> list[bool]:
        """Delete the pool's victims, whoever wrote them; answer which are gone.  Those
        of this namespace are read first and reported in ``evicted`` once gone."""
        store, ns = self._store, self._ns
        own = [key for space, key in victims if space == ns]
        total = 0
        with self._lock:
            self._ledger.doom(own)
        try:
            # a fault of one file is a block fault (.faults): that victim stays, counted
            found = dict(zip(own, self._each(store.read, own, None, "evict")[0], strict=True))
            gone = self._each(self._capacity.remove_victim, victims, False, "evict")[0]
            for (space, key), ok in zip(victims, gone, strict=True):
                data = found.get(key) if space == ns and ok else None
                if data is not None:  # None: unreadable, or deleted by an explicit evict
                    evicted.append((key, data))
                    total += len(data)
        finally:
            with self._lock:
                self._ledger.undoom(own)
                self._ledger.evictions += len(own)
                self._ledger.evicted_bytes += total
        return gone

    def _report_victims(
        self,
        victims: list[Victim],
        parts: Sequence[Sequence[BytesLike]],
        evicted: Evicted,
    ) -> None:
        stored = [key for key, i in victims if i is None]
        total = 0
        try:
            # Every victim is read and reported before any is deleted: a chain
            # takes a reported block as on its way to the tier below at once,
            # so a concurrent reader finds it here or there, never nowhere.
            found = iter(self._each(self._store.read, stored, None, "evict")[0])
            for key, i in victims:
                data = next(found) if i is None else joined(parts[i])
                if data is not None:  # None: another process deleted it first
                    evicted.append((key, data))
                    total += len(data)
            self._each(self._store.remove, stored, False, "evict")
        finally:
            with self._lock:
                self._ledger.undoom(stored)
                self._ledger.evicted_bytes += total

    def _get(self, keys: Sequence[bytes]) -> Sequence[BytesLike | None]:
        if len(keys) == 1:  # the common case, without the batch machinery
            known, seen = self._touch(keys)
            try:
                data = self._store.read(keys[0])
            except BaseException as exc:
                return [self._one(exc, None, self._store.probe_read, "read block")]
            if known[0] is (data is None):
                self._reconcile(keys, known, [None if data is None else len(data)], seen)
            return [data]
        unique = keys if len(keys) <= 1 else list(dict.fromkeys(keys))
        known, seen = self._touch(unique)
        found, faulted = self._each(self._store.read, unique, None, "read block")
        self._reconcile(unique, known, [None if d is None else len(d) for d in found], seen,
                        faulted)
        if unique is keys:
            return found
        by_key = dict(zip(unique, found, strict=True))
        return [by_key[key] for key in keys]

    def _get_into(
        self, keys: Sequence[bytes], buffers: Sequence[Sequence[memoryview]]
    ) -> Sequence[int | None]:
        if len(keys) == 1:  # the common case, without the batch machinery
            known, seen = self._touch(keys)
            try:
                size = self._store.read_into(keys[0], buffers[0])
            except BaseException as exc:
                return [self._one(exc, None, self._store.probe_read, "read block")]
            if known[0] is (size is None):
                self._reconcile(keys, known, [size], seen)
            return [size]
        # no de-duplication: every position has buffers of its own to fill
        known, seen = self._touch(keys)
        read_into = self._store.read_into
        sizes, faulted = self._each(
            lambda i: read_into(keys[i], buffers[i]), range(len(keys)), None, "read block"
        )
        self._reconcile(keys, known, sizes, seen, faulted)
        return sizes

    def _lookup(self, keys: Sequence[bytes]) -> Sequence[bool]:
        with self._lock:
            if not self.is_open:
                raise self.closed_error()
            index = self._ledger.index
            known = [key in index for key in keys]
            seen = self._ledger.deletions
        if all(known):
            return known
        # the index may lag behind other processes: stat what it lacks
        unknown = list(dict.fromkeys(k for k, hit in zip(keys, known, strict=True) if not hit))
        sizes, faulted = self._each(self._store.size, unknown, None, "stat block")
        self._reconcile(unknown, [False] * len(unknown), sizes, seen, faulted)
        found = {key for key, size in zip(unknown, sizes, strict=True) if size is not None}
        return [hit or key in found for key, hit in zip(keys, known, strict=True)]

    def _evict(self, keys: Sequence[bytes]) -> Sequence[bool]:
        unique = list(dict.fromkeys(keys))
        with self._lock:
            if not self.is_open:
                raise self.closed_error()
            self._ledger.doom(unique)
        try:
            self._capacity.forget(unique)
            # unlink even keys this process never saw: another may have written them
            removed = self._each(self._capacity.remove, unique, False, "evict block")[0]
        finally:
            with self._lock:
                self._ledger.undoom(unique)
        first = dict(zip(unique, removed, strict=True))
        out = []
        for key in keys:
            out.append(first[key])
            first[key] = False  # a repeated key was removed by its first mention
        return out

    # operators ------------------------------------------------------------
    def _scan(self, namespace: str | None) -> Iterator[list[ScanEntry]]:
        batches = scan_store(self._store, namespace, self.ensure_open)  # a bad name raises now

        def faults_as_backend_errors() -> Iterator[list[ScanEntry]]:
            try:
                yield from batches
            except BaseException as exc:
                self._raise(exc, "scan")

        return faults_as_backend_errors()

    # testing --------------------------------------------------------------
    def kit_tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        """Raw access for the conformance kit (kvtier.testing.RawAccess); no hook."""
        self.ensure_open()
        try:
            data = self._store.read(key)
            # raw rewrite in place, index untouched: like bit rot or a torn write
            return data is not None and self._store.rewrite(key, transform(data))
        except BaseException as exc:
            self._raise(exc, "tamper")

    # helpers --------------------------------------------------------------
    def _touch(self, keys: Sequence[bytes]) -> tuple[list[bool], int]:
        """Mark indexed keys as just used; answer which were indexed, and the
        deletions so far (for :meth:`_reconcile`)."""
        self._expirer.sweep()
        with self._lock:
            if not self.is_open:
                raise self.closed_error()
            known = self._ledger.touch(keys), self._ledger.deletions
        self._sizing.got(keys)
        self._capacity.used(keys)  # under a pool: a use, whichever process wrote them
        return known

    def _reconcile(
        self,
        keys: Sequence[bytes],
        known: list[bool],
        sizes: Sequence[int | None],
        seen: int,
        faulted: Sequence[int] = (),
    ) -> None:
        """Bring the index in line with what the store answered, where they disagree.

        A block whose read ``faulted`` is still there: its index entry stays.
        """
        if faulted:
            skip = set(faulted)
            keep = [i for i in range(len(keys)) if i not in skip]
            keys = [keys[i] for i in keep]
            known = [known[i] for i in keep]
            sizes = [sizes[i] for i in keep]
        for hit, size in zip(known, sizes, strict=True):
            if hit is (size is None):
                break
        else:
            return  # the common case: no second trip through the lock
        with self._lock:
            self._ledger.reconcile(keys, known, sizes, seen)

    def _map(self, fn: Callable[[T], R], items: Sequence[T], what: str) -> list[R]:
        """``[fn(x) for x in items]``, spread over the I/O threads for a batch.

        Workers pull the next item from a shared counter, so one slow file
        does not hold up a fixed share of the batch; the calling thread works
        too instead of just waiting.  Faults surface as BackendError after
        every item has finished, so no I/O of the batch is left running.
        """
        try:
            return run_batch(self._pool, self._threads, fn, items)
        except BaseException as exc:
            self._raise(exc, what)

    def _each(
        self, fn: Callable[[T], R], items: Sequence[T], miss: R, what: str
    ) -> tuple[list[R], list[int]]:
        """:meth:`_map` where a fault of one block answers ``miss`` for it (see
        :mod:`.faults`); answers the results and the positions that faulted."""
        probe = self._store.probe_read if miss is None else self._store.probe
        try:
            outcomes = map_batch(self._pool, self._threads, fn, items)
            return self._faults.settle(outcomes, miss, probe, what)
        except BaseException as exc:
            self._raise(exc, what)

    def _one(self, exc: BaseException, miss: R, probe: Callable[[], object], what: str) -> R:
        """``miss`` if ``exc``, raised for one block, is a fault of that block only."""
        if not isinstance(exc, Exception):
            raise exc
        try:
            return self._faults.settle([Failed(exc)], miss, probe, what)[0][0]
        except BaseException as err:
            self._raise(err, what)

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
