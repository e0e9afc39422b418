"""The ``fs`` backend's store on a local directory, in plain ``os`` calls.

A block is published by writing a temp file (``writev`` of its gather list)
and renaming it into place; it is read with one ``read`` into a bytes object,
or with ``preadv`` straight into the caller's buffers, and large blocks
bypass the page cache (:class:`~kvtier.backends.fs.direct.DirectIO`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import time
from collections.abc import Sequence
from typing import Any

from kvtier.block.buffers import byte_views, landed

from .direct import IOV_MAX, DirectIO
from .layout import (
    FAN_RE,
    TMP_PREFIX,
    Entry,
    Mapper,
    Store,
    drop_if_stale,
    listdir,
    scan_leaf,
    tmp_name,
)

__all__ = ["LocalStore"]

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class LocalStore(DirectIO, Store):
    local = True
    #: Set by the shared pool (:mod:`.pool_capacity`), which truncates its victims so that
    #: a reader holding one open keeps no room: a read then checks its file is still linked.
    victims_truncated = False

    def evicted(self, fd: int) -> bool:
        """Whether the file open as ``fd`` was evicted while it was read, so that what was
        read may be cut short or zeros: never where a file is only unlinked (its reader
        keeps the whole block); under the shared pool, once it is unlinked."""
        return self.victims_truncated and os.fstat(fd).st_nlink == 0

    def create_root(self) -> None:
        os.makedirs(self.nsroot, exist_ok=True)

    def probe(self) -> None:
        # os.access() lies for root and on read-only mounts: really try.
        tmp = os.path.join(self.nsroot, tmp_name())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o666)
        os.close(fd)
        os.unlink(tmp)

    def probe_read(self) -> None:
        os.listdir(self.nsroot)

    def write(self, key: bytes, parts: Sequence[Any], fsync: bool) -> int:
        # No existence check first: it would cost a syscall per block, and the
        # backend's index already skips keys it knows.  A block another
        # process wrote meanwhile is replaced by the same bytes, atomically.
        final = self.path(key)
        dirpath = final[: final.rindex("/")]
        tmp = f"{dirpath}/{tmp_name()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileNotFoundError:
            # first block of this fan-out directory: create it on demand rather
            # than paying a stat per write for a directory that almost always exists
            os.makedirs(dirpath, exist_ok=True)
            if fsync:
                _fsync_dir(dirpath[: dirpath.rindex("/")])
                _fsync_dir(self.nsroot)
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            # practically never: same pid and token in another container, or a
            # free-threaded race on the counter
            tmp = f"{tmp}-{secrets.token_hex(4)}"
            fd = os.open(tmp, flags, 0o666)
        published = False
        try:
            try:
                bufs = byte_views(parts)
                size = sum(map(len, bufs))
                if not self.write_large(fd, bufs, size):
                    _writev_all(fd, bufs)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            # rename is atomic: readers see no file or the whole block
            os.rename(tmp, final)
            published = True
            if fsync:
                _fsync_dir(dirpath)
            return size
        finally:
            if not published:
                # never leave a partial temp file behind a failed write
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _open(self, key: bytes) -> int | None:
        """The block's file, open for reading; None if there is none."""
        try:
            return os.open(self.path(key), os.O_RDONLY | _O_CLOEXEC)
        except FileNotFoundError:
            return None

    def read(self, key: bytes) -> bytes | None:
        fd = self._open(key)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            # one read into a bytes object of the file's size: no BytesIO, no
            # growth, no second copy (bytes is immutable, the caller may keep it)
            data = os.read(fd, size)
            if len(data) == size:
                return None if self.evicted(fd) else data
            # short read: over 2 GiB (Linux caps one read) or a concurrent tamper
            chunks = [data]
            got = len(data)
            while got < size:
                more = os.read(fd, size - got)
                if not more:
                    break
                chunks.append(more)
                got += len(more)
            return None if self.evicted(fd) else b"".join(chunks)
        finally:
            os.close(fd)

    def read_into(self, key: bytes, buffers: Sequence[memoryview]) -> int | None:
        fd = self._open(key)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            bufs = byte_views(buffers)
            # a size other than the buffers': the caller falls back to get(); skip the read
            fits = size == sum(map(len, bufs))
            got = self._read_all_into(fd, size, bufs) if fits else size
            if self.evicted(fd):
                return None
            if fits and got == size:
                landed(buffers)  # a sealed block is opened here, beside the other reads
            return got
        finally:
            os.close(fd)

    def _read_all_into(self, fd: int, size: int, bufs: list[Any]) -> int:
        if not size:
            return 0
        got = self.read_large(fd, size, bufs)
        if got is not None:
            return got
        # straight into the caller's memory: no intermediate bytes object
        offset = os.preadv(fd, bufs[:IOV_MAX], 0)
        if offset == size:
            return size
        views = [memoryview(b) for b in bufs]  # slicing must not copy
        _advance(views, offset)
        while views:
            n = os.preadv(fd, views[:IOV_MAX], offset)
            if n == 0:
                return offset  # shrank under us: report what was there
            offset += n
            _advance(views, n)
        return size

    def size(self, key: bytes) -> int | None:
        try:
            return os.stat(self.path(key)).st_size
        except FileNotFoundError:
            return None

    def remove(self, key: bytes) -> bool:
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            return False
        return True

    def rewrite(self, key: bytes, data: bytes) -> bool:
        try:
            fd = os.open(self.path(key), os.O_WRONLY | os.O_TRUNC | _O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            _writev_all(fd, byte_views([data]))
        finally:
            os.close(fd)
        return True

    def scan(self, mapper: Mapper[Any, Any]) -> tuple[list[Entry], int]:
        now = time.time()
        top = listdir(self.nsroot)
        stale = sum(drop_if_stale(e, now) for e in top if e.name.startswith(TMP_PREFIX))
        firsts = [e for e in top if FAN_RE.match(e.name) and e.is_dir(follow_symlinks=False)]
        # one task per first-level directory: a large cache scans in parallel
        found: list[tuple[list[Entry], int]] = mapper(lambda e: _scan_first(e, now), firsts)
        entries = [entry for part, _ in found for entry in part]
        return entries, stale + sum(n for _, n in found)


def _scan_first(first: os.DirEntry[str], now: float) -> tuple[list[Entry], int]:
    entries: list[Entry] = []
    stale = 0
    for second in listdir(first.path):
        if not (FAN_RE.match(second.name) and second.is_dir(follow_symlinks=False)):
            continue
        part, n = scan_leaf(first.name, second.name, second.path, now)
        entries.extend(part)
        stale += n
    return entries, stale


def _writev_all(fd: int, bufs: list[Any]) -> int:
    total = sum(map(len, bufs))
    if not total:
        return 0
    written = os.writev(fd, bufs[:IOV_MAX])
    if written == total:
        return total  # the usual case: one syscall, nothing copied
    # short write (signal, > 2 GiB, a full pipe): continue where it stopped
    views = [memoryview(b) for b in bufs]
    _advance(views, written)
    while views:
        n = os.writev(fd, views[:IOV_MAX])
        if n == 0:
            raise OSError(errno.EIO, "writev wrote nothing")
        _advance(views, n)
    return total


def _advance(views: list[memoryview], n: int) -> None:
    """Drop ``n`` bytes from the front of a gather/scatter list (short writev/preadv)."""
    while n:
        head = len(views[0])
        if n >= head:
            views.pop(0)
            n -= head
        else:
            views[0] = views[0][n:]
            n = 0


def _fsync_dir(path: str) -> None:
    # a rename or a new entry is durable only once its directory is synced
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
