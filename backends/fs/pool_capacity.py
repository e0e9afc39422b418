"""The store of a local ``fs`` root under a shared pool (:mod:`kvtier.backends.fs.pool`):
:class:`PoolStore` settles the room the pool reserved for each write and deletes the
pool's victims (:func:`kvtier.backends.fs.pool.attach` makes one).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .local import LocalStore

if TYPE_CHECKING:
    from .pool import SharedPool

__all__ = ["PoolStore"]


class PoolStore(LocalStore):
    """A local store whose writes settle the room the pool reserved for them."""

    pool: SharedPool

    def remove_victim(self, victim: tuple[str, bytes]) -> bool:
        """Delete a victim of any namespace of the root: True, its file is gone (also if
        it was already); a fault raises, for the backend's rule on faults.

        Unlinked, then truncated: a file still open, in a read of any process or in a
        program that holds it, would keep its bytes on the disk after its room was
        given to another block.  Unlinked first, so that a read that overlapped the
        truncation finds the file unlinked (:meth:`evicted`) and answers a miss."""
        ns, key = victim
        path = self.path(key) if ns == self.pool.ns else LocalStore(
            f"{self.pool.root}/{ns}").path(key)
        try:
            fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return True
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)
        return True

    def evicted(self, fd: int) -> bool:
        return os.fstat(fd).st_nlink == 0

    def remove(self, key: bytes) -> bool:
        """An explicit evict's deletion, whose row went first (``SharedPool.forget``): a
        file that a fault of its own keeps (``EPERM``, ``EIO``) is counted again, else it
        stayed on the disk uncounted until the next open."""
        try:
            return super().remove(key)
        except OSError:
            with contextlib.suppress(OSError):  # the deletion's fault is the one to raise
                size = self.size(key)
                if size is not None:
                    self._count_again(key, size)
            raise

    def _count_again(self, key: bytes, size: int) -> None:
        pool = self.pool
        with pool._txn() as db:  # as a file found at open (SharedPool.adopt)
            if db.execute("INSERT OR IGNORE INTO blocks(ns, key, size, state, writer, used) "
                          "VALUES (?, ?, ?, 'S', ?, ?)",
                          (pool.ns, key, size, pool.me, time.time_ns())).rowcount:
                pool._add(db, pool.ns, size, 0)

    def write(self, key: bytes, parts: Sequence[Any], fsync: bool) -> int:
        try:
            size = super().write(key, parts, fsync)
        except BaseException:
            self.pool.settle(key, None)
            raise
        self.pool.settle(key, size)
        return size
