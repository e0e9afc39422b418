"""On-disk layout of the ``fs`` backend and the raw store contract its stores share.

Every store keeps one layout, ``<root>/<namespace>/<hex[0:2]>/<hex[2:4]>/<hex>.kvb``:

* :class:`~kvtier.backends.fs.local.LocalStore` speaks plain ``os`` calls
  (``writev``, ``preadv``, one ``read`` per block) because fsspec's file
  objects cost a copy and several Python frames per block, and this path must
  keep up with plain file I/O; its large reads bypass the page cache
  (:mod:`kvtier.backends.fs.direct`).
* :class:`~kvtier.backends.fs.remote.RemoteStore` speaks fsspec and publishes a
  block with one ``pipe_file``, which object stores (and ``memory://``) make
  atomic.

Neither keeps any state about blocks: the index, capacity and locking live in
:mod:`kvtier.backends.fs` and :mod:`kvtier.backends.fs.capacity`.  A missing
file is reported as ``None``/``False``, every other failure is left to raise
(``OSError`` or whatever fsspec raises).
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "FAN_RE",
    "NAMESPACE_RE",
    "STALE_TMP_SECONDS",
    "SUFFIX",
    "TMP_PREFIX",
    "Entry",
    "Mapper",
    "Store",
    "drop_if_stale",
    "fan_out",
    "key_of_name",
    "listdir",
    "scan_leaf",
    "tmp_name",
]

T = TypeVar("T")
R = TypeVar("R")
#: Runs ``fn`` over ``items`` (possibly in parallel), results in order.
Mapper = Callable[[Callable[[T], R], Sequence[T]], list[R]]

SUFFIX = ".kvb"
TMP_PREFIX = ".tmp-"
#: A temp file this old belongs to a writer that died; younger ones may still
#: be in flight in another process and are left alone.
STALE_TMP_SECONDS = 600.0

#: A namespace directory: the only form accepted, since it becomes a path.
NAMESPACE_RE = re.compile(r"^[0-9a-f]{32}$")
#: Either level of the fan-out directories.
FAN_RE = re.compile(r"^[0-9a-f]{2}$")
# A key is 1..64 bytes, so its name is 2..128 lowercase hex digits, even length.
_NAME_RE = re.compile(r"^((?:[0-9a-f]{2}){1,64})\.kvb$")


def fan_out(hexkey: str) -> tuple[str, str]:
    """The two directory levels of a key's file.

    A one-byte key has only two hex digits; its second level is padded with
    ``0``.  The file name carries the whole hex, so padding never collides.
    """
    return hexkey[0:2], (hexkey[2:4] or "00")


def key_of_name(d1: str, d2: str, name: str) -> bytes | None:
    """The key stored in ``<d1>/<d2>/<name>``, or None if that is not a block we wrote."""
    match = _NAME_RE.match(name)
    if match is None:
        return None
    hexkey = match.group(1)
    # A well-named file in the wrong directory would never be found by get():
    # it is not ours, so it is not counted either.
    if fan_out(hexkey) != (d1, d2):
        return None
    return bytes.fromhex(hexkey)


# Temp names: pid for humans, a random token drawn once per process (pids
# repeat across containers sharing a directory) and a counter, so that
# concurrent writers of one key never collide; O_EXCL is the final guard.
# Drawing randomness per file would cost a getrandom() syscall per block.
_TOKEN = secrets.token_hex(4)
_COUNTER = itertools.count()


def tmp_name() -> str:
    return f"{TMP_PREFIX}{os.getpid()}-{_TOKEN}{next(_COUNTER):x}"


@dataclass(frozen=True)
class Entry:
    """A block found while scanning the tree."""

    key: bytes
    size: int
    mtime: float


class Store:
    """The raw operations the backend needs; paths come from :meth:`path`."""

    local = False
    memory = False

    def __init__(self, nsroot: str) -> None:
        self.nsroot = nsroot

    def path(self, key: bytes) -> str:
        hexkey = key.hex()
        d1, d2 = fan_out(hexkey)
        return f"{self.nsroot}/{d1}/{d2}/{hexkey}{SUFFIX}"

    def create_root(self) -> None:
        raise NotImplementedError

    def probe(self) -> None:
        """Write and remove a scratch file: raises if the root is not writable."""
        raise NotImplementedError

    def probe_read(self) -> None:
        """Raises if the root cannot be read (see :mod:`kvtier.backends.fs.faults`)."""
        self.probe()

    def write(self, key: bytes, parts: Sequence[Any], fsync: bool) -> int:
        """Publish ``parts`` atomically under ``key``; answer the stored size.

        A block already on disk is not rewritten (blocks are immutable).
        """
        raise NotImplementedError

    def read(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def read_into(self, key: bytes, buffers: Sequence[memoryview]) -> int | None:
        raise NotImplementedError

    def size(self, key: bytes) -> int | None:
        raise NotImplementedError

    def remove(self, key: bytes) -> bool:
        raise NotImplementedError

    def rewrite(self, key: bytes, data: bytes) -> bool:
        """Overwrite a stored block in place, for the kit's raw access (``kit_tamper``)."""
        raise NotImplementedError

    def scan(self, mapper: Mapper[Any, Any]) -> tuple[list[Entry], int]:
        """Every block under the namespace, and how many stale temp files were removed."""
        raise NotImplementedError


# Walking a local tree: shared by the scan at open and the persistent index.


def scan_leaf(d1: str, d2: str, path: str, now: float) -> tuple[list[Entry], int]:
    """The blocks in one leaf directory ``<d1>/<d2>``, and the stale temp files removed."""
    entries: list[Entry] = []
    stale = 0
    for f in listdir(path):
        if f.name.startswith(TMP_PREFIX):
            stale += drop_if_stale(f, now)
            continue
        key = key_of_name(d1, d2, f.name)
        if key is None:
            continue
        try:
            st = f.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # evicted by another process meanwhile
        if f.is_file(follow_symlinks=False):
            entries.append(Entry(key, st.st_size, st.st_mtime))
    return entries, stale


def listdir(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except FileNotFoundError:
        return []


def drop_if_stale(entry: os.DirEntry[str], now: float) -> int:
    try:
        if entry.stat(follow_symlinks=False).st_mtime < now - STALE_TMP_SECONDS:
            os.unlink(entry.path)
            return 1
    except FileNotFoundError:
        pass  # another process cleaned it up first
    return 0
