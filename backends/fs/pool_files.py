"""The bytes of the shared pool's own files under a root, counted in its ``capacity``.

Beside the block files, kvtier writes under a pooled root the index
(``.kvtier-pool.db``, or the generation a rebuild made and the name links
to), its log (``-wal``) and shared memory (``-shm``), the rebuild lock, each
writer's journal (``.kvtier-pool.db.writer-*``), the one damaged index kept
(``.damaged``, ``.damaged-wal``), and each namespace's ``index.kvi``, written
at close.  Every one of them starts with the index's name, or is the
``index.kvi`` of a namespace directory: one listing of the root and a ``stat``
each finds them all, whatever wrote them.

Blocks get the capacity less what these bytes exceed :data:`ALLOWANCE` by
(:meth:`~.pool.SharedPool._grant` measures them each time room is taken).  A
listing takes a ``stat`` per namespace (and per journal: one per tenant's
instance that puts), milliseconds for a thousand tenants, so a grant does not
list the root each time: the figures of the last listing serve
(:class:`OwnFiles`, one per root in a process, shared by its tenants'
instances) until the root directory changes (a file or a namespace made,
removed or renamed: a new writer's journal, a rebuilt index), or the listing
is :data:`STALE_S` old, or a hundred times as old as it took (listings take at
most 1% of the time).  The log is counted at its bound
(:func:`~.pool_db.wal_limit`), not at its length, since it grows between two
measurements and is emptied at its bound.  So the files under the root exceed
the capacity at most by the allowance, what the other files grew since they
were last listed (at most a second before room was taken), and a transaction
past the log's last quarter, whatever the number of writers
(docs/shared-capacity.md, "The pool's own files").
"""

from __future__ import annotations

import os
import threading
import time
import weakref

from .index import INDEX_NAME
from .layout import NAMESPACE_RE
from .pool_options import DB_NAME
from .pool_writers import JOURNAL_PREFIX

__all__ = ["ALLOWANCE", "JOURNAL_SLACK", "STALE_S", "OwnFiles", "held", "own_files"]

#: The pool's own bytes that the capacity does not count: a pool's index, log floor and
#: shared memory alone take about 150 KiB, so a capacity of a few hundred KiB (a small
#: tier, or a test's) would hold no block if they all counted; beyond these, every byte
#: does.
ALLOWANCE = 512 << 10


def held(st: os.stat_result) -> int:
    """The bytes a file takes on its filesystem: its allocated blocks (what ``du``
    counts), or its length where allocation lags (a sparse or unflushed file)."""
    return max(st.st_blocks * 512, st.st_size)


#: What a writer's journal is counted at beyond its size: the filesystem block that its
#: next lines, appended without room taken, may need (4 KiB on ext4, XFS and tmpfs).
JOURNAL_SLACK = 4096


#: A listing's figures serve at most this long ...
STALE_S = 1.0
#: ... and at most this many times as long as the listing took.
_SHARE = 100
#: A root changed less than a timestamp's grain before it was looked at can change again
#: unseen (its time left as it was): a listing then serves one measure.  A clock tick (10
#: ms at most) where timestamps have nanoseconds; where they are whole seconds (ext4 with
#: 128-byte inodes, as mkfs makes for a small disk), two.
_GRAIN_NS = 50_000_000
_COARSE_GRAIN_NS = 2_000_000_000


class OwnFiles:
    """The pool's own files under ``root``, as its last listing found them; thread-safe."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.listings = 0  # listings of the root made
        self._lock = threading.Lock()
        self._files: dict[str, int] = {}  # the pool's files: name -> bytes (a journal's + slack)
        self._total = 0  # the bytes of them all, and of the namespaces' index.kvi
        # the root's (inode, time of change) at the listing; None: list again
        self._seen: tuple[int, int] | None = None
        self._stale_at = 0.0  # when the listing's figures stop serving (time.monotonic)

    def measure(self, wal: str, wal_charge: int) -> int:
        """The bytes of the pool's own files, with the log ``wal`` counted as at least
        ``wal_charge`` and each journal :data:`JOURNAL_SLACK` beyond its size; a file
        deleted while this lists is not counted."""
        with self._lock:
            try:
                st = os.stat(self.root)
            except FileNotFoundError:
                return wal_charge
            if (st.st_ino, st.st_mtime_ns) != self._seen or time.monotonic() >= self._stale_at:
                self._list(st)
            files, total = self._files, self._total
        # the log at its bound; emptied and deleted since: it comes back
        log = files.get(os.path.basename(wal), 0)
        return total - log + max(log, wal_charge)

    def _list(self, st: os.stat_result) -> None:
        """List the root (``st``: its ``stat`` before) and ``stat`` the pool's files."""
        start = time.monotonic()
        files: dict[str, int] = {}
        namespaces = 0
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            name = entry.name
            try:
                if name.startswith(DB_NAME):
                    if entry.is_symlink():  # the name of a rebuilt index: its target is counted
                        continue
                    size = held(entry.stat(follow_symlinks=False))
                    files[name] = size + (JOURNAL_SLACK if name.startswith(JOURNAL_PREFIX) else 0)
                elif NAMESPACE_RE.match(name):
                    namespaces += held(os.stat(os.path.join(entry.path, INDEX_NAME)))
            except (FileNotFoundError, NotADirectoryError):
                continue
        now = time.monotonic()
        self._files, self._total = files, sum(files.values()) + namespaces
        self.listings += 1
        self._stale_at = now + min(STALE_S, (now - start) * _SHARE)
        grain = _COARSE_GRAIN_NS if st.st_mtime_ns % 1_000_000_000 == 0 else _GRAIN_NS
        quiet = time.time_ns() - st.st_mtime_ns > grain
        self._seen = (st.st_ino, st.st_mtime_ns) if quiet else None


_ROOTS: weakref.WeakValueDictionary[str, OwnFiles] = weakref.WeakValueDictionary()
_ROOTS_LOCK = threading.Lock()


def own_files(root: str) -> OwnFiles:
    """The :class:`OwnFiles` of ``root`` in this process, while a pool of it is open: the
    instances of a root (one per tenant) share its listings."""
    key = os.path.realpath(root)
    with _ROOTS_LOCK:
        found = _ROOTS.get(key)
        if found is None:
            found = _ROOTS[key] = OwnFiles(root)
        return found
