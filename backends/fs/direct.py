"""Large blocks of a local ``fs`` tier, past the page cache: written with
O_DIRECT, read from the page cache if it holds the whole file, else with
O_DIRECT, straight from and into the caller's buffers.

:class:`DirectIO` is the part of :class:`~kvtier.backends.fs.local.LocalStore`
that decides and does it; it keeps only what the filesystem refused
(O_DIRECT, ``RWF_NOWAIT``), so that it stops asking.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvtier.block.buffers import copy_bytes, scatter

__all__ = ["DIRECT_MIN", "IOV_MAX", "DirectIO"]

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
#: Blocks from this size up are written and read with O_DIRECT when the store allows it.
DIRECT_MIN = 256 << 10
#: ... and up to this size: a bigger block would pin a bounce buffer that large
#: in every I/O thread.
_DIRECT_MAX = 64 << 20
#: O_DIRECT wants file offset, length and memory aligned to the device's
#: logical block; 4 KiB covers every common device.
_ALIGN = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)
#: preadv2 flag: answer EAGAIN instead of waiting for the disk (Linux >= 4.14).
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)

log = logging.getLogger("kvtier.backends.fs")
_bounce = threading.local()  # one aligned buffer per I/O thread
_probe = threading.local()  # one cachestat argument pair per I/O thread


class DirectIO:
    """How a local store writes and reads a large block: with O_DIRECT where it
    can, and a read from the page cache if it is all there."""

    nsroot: str
    #: Smallest file :meth:`write_large` and :meth:`read_large` take; 0 = none.
    #: Set by the backend from its ``direct_io`` option.
    direct_min = 0
    #: Try the page cache without blocking before an O_DIRECT read; cleared
    #: when the filesystem refuses ``RWF_NOWAIT``.
    nowait = bool(_RWF_NOWAIT)

    def write_large(self, fd: int, bufs: list[Any], size: int) -> bool:
        """Write the new, empty file ``fd`` with O_DIRECT; False: the caller writes it
        through the page cache instead (nothing was written).

        A buffered write costs this machine's kernel a page-cache copy and
        page allocations per block, then a writeback: 1.0-1.7 s of CPU per
        GB (1024 x 1 MiB, write and rename, counted with the sync), against
        0.11-0.25 s per GB with O_DIRECT; that CPU is what an engine's
        compute on the same cores loses.  KV written down is also not
        cached a second time.  The plan is the read's: aligned buffers go as
        they are, others through this thread's bounce buffer; the last one
        is written apart (below).
        """
        if not (self.direct_min and self.direct_min <= size <= _DIRECT_MAX):
            return False
        plan = _direct_plan(bufs, size)
        if plan is None:
            return False
        iov, copies = plan
        for slot, src in copies:
            copy_bytes(src, slot)
        # A block that ends off the alignment (a sealed block's 16-byte tag) ends in a
        # bounce slot: the aligned part goes with O_DIRECT, the last bytes through the
        # page cache.  Writing the slot padded and cutting the file back cost more: on
        # ext4 the cut reads the last block back from the disk, at once, to zero its
        # rest, and journals the file as an orphan (BENCHMARKS.md, "Encryption at rest").
        tail = size % _ALIGN
        tail_bytes = b""
        if tail:
            last = iov.pop()
            end = last.nbytes - _ALIGN  # only the last slot is padded, by less than _ALIGN
            if end:
                iov.append(last[:end])
            tail_bytes = last[end : end + tail]
        aligned = size - tail
        try:
            # F_SETFL sets only the status flags, and none other is in use here
            fcntl.fcntl(fd, fcntl.F_SETFL, _O_DIRECT)
            written = os.pwritev(fd, iov, 0) if len(iov) <= IOV_MAX else -1
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            log.info("%s: O_DIRECT refused (%s), writing through the page cache",
                     self.nsroot, exc)
            self.direct_min = 0
            written = -1
        fcntl.fcntl(fd, fcntl.F_SETFL, 0)
        if written == aligned and tail:
            written += os.pwrite(fd, tail_bytes, aligned)
        if written < size:  # refused, or short: the caller writes it all again
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            return False
        return True

    def read_large(self, fd: int, size: int, bufs: list[Any]) -> int | None:
        """Read the file of ``size`` bytes open as ``fd`` into ``bufs``, bypassing the
        page cache where that pays; ``None``: read it through the page cache instead."""
        if not (self.direct_min and self.direct_min <= size <= _DIRECT_MAX):
            return None
        if self.nowait and self._read_cached(fd, size, bufs):
            return size
        return self._read_direct(fd, size, bufs)

    def _read_cached(self, fd: int, size: int, bufs: list[Any]) -> bool:
        """Read the whole file from the page cache if it is all there, without waiting.

        A file written or read moments ago sits in the page cache, and an
        O_DIRECT read would fetch it from the disk again, several times
        slower (BENCHMARKS.md, "Figures behind design choices").
        ``RWF_NOWAIT`` answers EAGAIN, or a short count, as soon as a page is
        missing; then the caller reads the whole file with O_DIRECT (a short
        read is simply read again: the pages it got may be stale by then only
        if the file was replaced, and a replaced block has the same bytes).
        But a ``RWF_NOWAIT`` miss starts the kernel's readahead of the whole
        file (see the same section), which doubles the disk traffic and
        caches KV a second time: so ``cachestat`` (Linux >= 6.5) is asked
        first, where the kernel has it, and only a file it finds cached all
        through is read.
        """
        if len(bufs) > IOV_MAX or _all_cached(fd, size) is False:
            return False
        try:
            return bool(os.preadv(fd, bufs, 0, _RWF_NOWAIT) == size)
        except BlockingIOError:
            return False  # not (all) cached: read it from the disk
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            log.info("%s: RWF_NOWAIT refused (%s), reading with O_DIRECT only", self.nsroot, exc)
            self.nowait = False
            return False

    def _read_direct(self, fd: int, size: int, bufs: list[Any]) -> int | None:
        """Read the file with O_DIRECT; ``None`` if the filesystem refuses it.

        Bypassing the page cache is what makes a cold read fast (BENCHMARKS.md,
        "Figures behind design choices") and keeps a second copy of KV out of RAM.  O_DIRECT needs
        aligned memory, lengths and file offsets: buffers that qualify (a
        block's payload, which the block format aligns, landing in an
        engine's page-aligned KV rows) are read into in place; the rest (the
        header, a caller's unaligned memory) go through this thread's aligned
        bounce buffer and are copied out, in numpy, which lets go of the GIL.
        A store whose filesystem refuses O_DIRECT (some FUSE mounts, old
        tmpfs) stops trying.
        """
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | _O_DIRECT)
            plan = _direct_plan(bufs, size)
            if plan is not None:
                iov, copies = plan
                got = os.preadv(fd, iov[:IOV_MAX], 0) if len(iov) <= IOV_MAX else -1
                if got == size:
                    for src, dst in copies:
                        copy_bytes(src, dst)
                    return size
            # odd scatter lists, and the rare short read: the whole file at once
            bounce = _bounce_buffer(size)
            want = -(-size // _ALIGN) * _ALIGN
            got = os.preadv(fd, [bounce[:want]], 0)
            while got < size and got % _ALIGN == 0:  # stops short only at EOF or a signal
                n = os.preadv(fd, [bounce[got:want]], got)
                if n == 0:
                    break
                got += n
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            log.info("%s: O_DIRECT refused (%s), reading through the page cache", self.nsroot, exc)
            self.direct_min = 0
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)
            return None
        scatter(bounce, bufs, min(got, size))
        return got if got < size else size


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in
                ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


#: cachestat(2)'s number, the same on every architecture (it came after the
#: tables were unified); None once the kernel or libc says it has none.
_CACHESTAT_NR: int | None = 451 if os.uname().sysname == "Linux" else None
_syscall: Any = None


def _all_cached(fd: int, size: int) -> bool | None:
    """Whether every page of the file is in the page cache; None: cannot tell.

    ``cachestat`` looks without side effects (no readahead, no LRU update).
    It costs about 14 us through ctypes here, 4% of a 2 MiB read from the
    page cache, against the tenfold loss of reading a cached block from disk.
    """
    global _CACHESTAT_NR, _syscall
    if _CACHESTAT_NR is None:
        return None
    if _syscall is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).syscall
        except (OSError, AttributeError):
            _CACHESTAT_NR = None
            return None
        fn.restype = ctypes.c_long
        fn.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_uint]
        _syscall = fn
    args = getattr(_probe, "args", None)
    if args is None:
        rng, stat = _CachestatRange(0, 0), _Cachestat()  # len 0: to the end of the file
        args = _probe.args = (rng, stat, ctypes.addressof(rng), ctypes.addressof(stat))
    if _syscall(_CACHESTAT_NR, fd, args[2], args[3], 0) != 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):  # old kernel, or seccomp
            _CACHESTAT_NR = None
        return None
    return bool(args[1].nr_cache * mmap.PAGESIZE >= size)


def _bounce_buffer(size: int) -> memoryview:
    """This thread's page-aligned buffer, at least ``size`` rounded up to 1 MiB."""
    view: memoryview | None = getattr(_bounce, "view", None)
    if view is None or view.nbytes < size:
        # mmap memory is page aligned, which O_DIRECT needs and bytearray is not
        view = memoryview(mmap.mmap(-1, -(-size // (1 << 20)) * (1 << 20)))
        _bounce.view = view
    return view


def _direct_plan(
    bufs: Sequence[Any], size: int
) -> tuple[list[Any], list[tuple[memoryview, Any]]] | None:
    """The iovecs of one O_DIRECT read into (or write from) ``bufs``, and the
    copies after (before) it: ``(bounce slot, buffer)`` pairs.

    A buffer whose address and length are aligned is used directly;
    another takes an aligned slot of the bounce buffer, which only works
    if its length is aligned too (or it is the last), so that every later
    buffer still starts at an aligned file offset.  ``None``: no such plan.
    """
    lengths = [len(b) for b in bufs]
    if any(n % _ALIGN for n in lengths[:-1]):
        return None
    bounce = _bounce_buffer(size + _ALIGN)
    iov: list[Any] = []
    copies: list[tuple[memoryview, Any]] = []
    used = 0
    for buf, n in zip(bufs, lengths):
        if n % _ALIGN == 0 and np.frombuffer(buf, dtype=np.uint8).ctypes.data % _ALIGN == 0:
            iov.append(buf)
            continue
        slot = bounce[used : used + n + (-n % _ALIGN)]
        used += slot.nbytes
        iov.append(slot)
        copies.append((slot[:n], buf))
    return iov, copies
