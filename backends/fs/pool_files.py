"""The bytes of the shared pool's own files under a root, counted in its ``capacity``.

Beside the block files, kvtier writes under a pooled root the index
(``.kvtier-pool.db``, or the generation a rebuild made and the name links
to), its log (``-wal``) and shared memory (``-shm``), the rebuild lock, each
writer's journal (``.kvtier-pool.db.writer-*``), the one damaged index kept
(``.damaged``, ``.damaged-wal``), and each namespace's ``index.kvi``, written
at close.  Every one of them starts with the index's name, or is the
``index.kvi`` of a namespace directory: one listing of the root and a ``stat``
each (tens of microseconds) finds them all, whatever wrote them.

Blocks get the capacity less what these bytes exceed :data:`ALLOWANCE` by
(:meth:`~.pool.SharedPool._grant` measures them each time room is taken).  The
log is counted at its bound (:func:`~.pool_db.wal_limit`), not at its length,
since it grows between two measurements and is emptied at its bound.  So the
files under the root exceed the capacity at most by the allowance, what the
other files grew since room was last taken, and a transaction past the log's
last quarter, whatever the number of writers (docs/shared-capacity.md, "The
pool's own files").
"""

from __future__ import annotations

import os

from .index import INDEX_NAME
from .layout import NAMESPACE_RE
from .pool_options import DB_NAME
from .pool_writers import JOURNAL_PREFIX

__all__ = ["ALLOWANCE", "JOURNAL_SLACK", "held", "own_files_bytes"]

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


def own_files_bytes(root: str, wal: str, wal_charge: int) -> int:
    """The bytes of the pool's own files under ``root``, with the log ``wal`` counted
    as at least ``wal_charge`` and each journal :data:`JOURNAL_SLACK` beyond its size;
    a file deleted while this looks is not counted."""
    total, wal_name = 0, os.path.basename(wal)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return wal_charge
    for entry in entries:
        name = entry.name
        try:
            if name.startswith(DB_NAME):
                if entry.is_symlink():  # the name of a rebuilt index: its target is counted
                    continue
                size = held(entry.stat(follow_symlinks=False))
                if name == wal_name:
                    size = max(size, wal_charge)
                elif name.startswith(JOURNAL_PREFIX):
                    size += JOURNAL_SLACK
                total += size
            elif NAMESPACE_RE.match(name):
                total += held(os.stat(os.path.join(entry.path, INDEX_NAME)))
        except (FileNotFoundError, NotADirectoryError):
            continue
    if not any(entry.name == wal_name for entry in entries):
        total += wal_charge  # emptied and deleted since: it comes back
    return total
