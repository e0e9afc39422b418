"""A persistent index for a local ``fs`` tier, so that reopening a large one needs no full scan.

Walking a tree of a million block files costs a ``stat`` per file (seconds
to minutes, depending on the disk's cache).  At close the backend writes
what it knows, key and size in LRU order, to ``<namespace>/index.kvi``; at
open that file is trusted only per leaf directory (``<hex[0:2]>/<hex[2:4]>``)
whose modification time is still the one recorded: creating, renaming or
deleting a file in a directory changes its mtime, so any directory touched
since (by this process after the index was written, by a crash's leftovers,
by another process) is listed and stat'ed again, and only those.

The index never decides what data a read returns: every block is read from
its own file and checked (magic, namespace, key, checksum) by the tier.  A
stale entry costs at most a wrong capacity figure until the next put or get
of that key sets it right.  What the check cannot see, and so is not
caught: a file rewritten in place with another length (its directory keeps
its mtime), and files added by another process while this one had the tier
open (written before the index is, so their directory looks unchanged): a
lookup still finds them on disk, they are just not counted until then.

Format (little endian)::

    b"KVTI" | version u16 | 0 u16 | dirs u32 | entries u64 | key bytes u64
    | dirs x (leaf id u16, pad u16, count u32, mtime_ns i64)
    | entries x key length u8 | entries x size u64 | entries x leaf id u16
    | key bytes | xxh3-64 of everything before, 8 bytes

Entries are in LRU order, least recently used first.  A leaf directory is
recorded with mtime 0 (never matches) when it changed within
:data:`_RACY_SECONDS` of the snapshot: a change in the same clock tick
would leave its mtime as recorded.  Anything that does not parse, or whose
checksum differs, is ignored and the tree is scanned as before.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from .layout import FAN_RE, TMP_PREFIX, Entry, Mapper, Store, listdir, scan_leaf
from .local import LocalStore

__all__ = ["INDEX_NAME", "leaf_of", "load_index", "load_tree", "save_index", "save_or_warn"]

log = logging.getLogger("kvtier.backends.fs")

INDEX_NAME = "index.kvi"
_MAGIC = b"KVTI"
_VERSION = 1
_HEAD = struct.Struct("<4sHHIQQ")
_DIR = np.dtype([("leaf", "<u2"), ("pad", "<u2"), ("count", "<u4"), ("mtime", "<i8")])
_RACY_SECONDS = 2.0


def leaf_of(key: bytes) -> int:
    """The leaf directory of a key as a number: ``int(d1 + d2, 16)`` of :func:`fan_out`."""
    return key[0] << 8 | (key[1] if len(key) > 1 else 0)


def leaf_mtimes(store: LocalStore, mapper: Mapper[Any, Any]) -> dict[int, int]:
    """Every leaf directory of the tree and its mtime in ns (one stat each, in parallel)."""

    def first(name: str) -> list[tuple[int, int]]:
        out = []
        for second in listdir(f"{store.nsroot}/{name}"):
            if not FAN_RE.match(second.name):
                continue
            try:
                st = second.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if second.is_dir(follow_symlinks=False):
                out.append((int(name + second.name, 16), st.st_mtime_ns))
        return out

    firsts = [e.name for e in listdir(store.nsroot)
              if FAN_RE.match(e.name) and e.is_dir(follow_symlinks=False)]
    return {leaf: mtime for part in mapper(first, firsts) for leaf, mtime in part}


def save_index(store: LocalStore, keys: Sequence[bytes], sizes: Sequence[int],
               mapper: Mapper[Any, Any], fsync: bool) -> None:
    """Write the index of ``keys`` (LRU order) atomically; the directory state is read now."""
    snapshot = time.time_ns() - int(_RACY_SECONDS * 1e9)
    mtimes = leaf_mtimes(store, mapper)
    n = len(keys)
    lengths = np.fromiter(map(len, keys), dtype=np.uint8, count=n)
    leaves = np.fromiter(map(leaf_of, keys), dtype=np.uint16, count=n)
    ids, counts = np.unique(leaves, return_counts=True)
    dirs = np.zeros(len(ids), dtype=_DIR)
    dirs["leaf"], dirs["count"] = ids, counts
    # a leaf changed too recently to trust its mtime, or gone, never matches
    dirs["mtime"] = [m if (m := mtimes.get(int(i), 0)) < snapshot else 0 for i in ids]
    blob = b"".join(keys)
    body = b"".join([
        _HEAD.pack(_MAGIC, _VERSION, 0, len(ids), n, len(blob)), dirs.tobytes(),
        lengths.tobytes(), np.asarray(sizes, dtype="<u8").tobytes(), leaves.tobytes(), blob])
    tmp = f"{store.nsroot}/{TMP_PREFIX}index-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        with open(tmp, "wb") as f:
            f.write(body)
            f.write(xxhash.xxh3_64_digest(body))
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.rename(tmp, f"{store.nsroot}/{INDEX_NAME}")  # readers see the old index or the new
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_or_warn(store: LocalStore, keys: Sequence[bytes], sizes: Sequence[int], fsync: bool,
                 url: str, mapper: Mapper[Any, Any]) -> None:
    """:func:`save_index` at close; a failure only costs the next open a full scan: logged."""
    try:
        save_index(store, keys, sizes, mapper, fsync)
    except OSError as exc:
        log.warning("fs tier %s: index not saved (%s); the next open scans the tree", url, exc)


def _parse(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bytes] | None:
    """The arrays of an index file, or None if it is not one this version wrote, whole."""
    if len(data) < _HEAD.size + 8 or xxhash.xxh3_64_digest(data[:-8]) != data[-8:]:
        return None
    magic, version, _, ndirs, n, nkey = _HEAD.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        return None
    at = _HEAD.size
    want = at + ndirs * _DIR.itemsize + n * (1 + 8 + 2) + nkey + 8
    if want != len(data):
        return None
    dirs = np.frombuffer(data, dtype=_DIR, count=ndirs, offset=at)
    at += ndirs * _DIR.itemsize
    lengths = np.frombuffer(data, dtype=np.uint8, count=n, offset=at)
    sizes = np.frombuffer(data, dtype="<u8", count=n, offset=at + n)
    leaves = np.frombuffer(data, dtype="<u2", count=n, offset=at + 9 * n)
    keys = data[at + 11 * n: at + 11 * n + nkey]
    if n and (int(lengths.min()) < 1 or int(lengths.max()) > 64
              or int(lengths.sum(dtype=np.int64)) != nkey):
        return None
    return dirs, lengths, sizes, leaves, keys


def load_tree(store: Store, mapper: Mapper[Any, Any]
              ) -> tuple[OrderedDict[bytes, int], int, int]:
    """What the tree holds at open, as :func:`load_index` answers it.

    A local tier's index file spares the stat of every block; without a
    usable one (or on a remote store) the whole tree is scanned, and the
    number of leaf directories rescanned is -1.
    """
    loaded = load_index(store, mapper) if isinstance(store, LocalStore) else None
    if loaded is not None:
        return loaded
    entries, stale = store.scan(mapper)
    # after a restart the order of use is lost: file age is the best guess
    entries.sort(key=lambda e: e.mtime)
    return OrderedDict((e.key, e.size) for e in entries), stale, -1


def load_index(store: LocalStore, mapper: Mapper[Any, Any]
               ) -> tuple[OrderedDict[bytes, int], int, int] | None:
    """The tree's blocks from the index, rescanning changed leaves.

    Answers key -> size in LRU order, the stale temp files removed and the
    number of leaf directories rescanned; None if there is no usable index
    (the caller scans the whole tree).
    """
    try:
        with open(f"{store.nsroot}/{INDEX_NAME}", "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    parsed = _parse(data)
    if parsed is None:
        return None
    dirs, lengths, sizes, leaves, blob = parsed
    ends = np.cumsum(lengths, dtype=np.int64).tolist()
    keys = [blob[end - ln: end] for end, ln in zip(ends, lengths.tolist())]
    # a key filed under the wrong leaf would never be rescanned: not our index
    if not np.array_equal(np.fromiter(map(leaf_of, keys), dtype=np.uint16, count=len(keys)),
                          leaves):
        return None
    index: OrderedDict[bytes, int] = OrderedDict(zip(keys, sizes.tolist()))
    if len(index) != len(keys):
        return None  # a repeated key: not something save_index writes
    recorded = dict(zip(dirs["leaf"].tolist(), dirs["mtime"].tolist()))
    now = leaf_mtimes(store, mapper)
    changed = sorted(leaf for leaf, mtime in now.items() if recorded.get(leaf) != mtime)
    drop = (set(recorded) - set(now)) | set(changed)
    doubtful: list[int] = []
    if drop:
        # the index's keys in leaves that are gone or changed: kept (in their
        # place) only if the rescan finds their file
        mask = np.isin(leaves, np.fromiter(drop, dtype=np.uint16, count=len(drop)))
        doubtful = np.flatnonzero(mask).tolist()
        for i in doubtful:
            index[keys[i]] = -1
    stale, fresh = _rescan(store, changed, mapper)
    for entry in sorted(fresh, key=lambda e: e.mtime):
        index[entry.key] = entry.size  # a key the index had keeps its place, new ones go last
    for i in doubtful:
        if index.get(keys[i]) == -1:
            del index[keys[i]]
    return index, stale, len(changed)


def _rescan(store: LocalStore, leaves: list[int], mapper: Mapper[Any, Any]
            ) -> tuple[int, list[Entry]]:
    now = time.time()

    def scan(leaf: int) -> tuple[list[Entry], int]:
        d1, d2 = f"{leaf >> 8:02x}", f"{leaf & 0xFF:02x}"
        return scan_leaf(d1, d2, f"{store.nsroot}/{d1}/{d2}", now)

    parts: list[tuple[list[Entry], int]] = mapper(scan, leaves)
    return sum(n for _, n in parts), [e for part, _ in parts for e in part]
