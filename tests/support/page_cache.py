"""Files pushed out of the page cache, so that the next read of them reaches the disk.

One helper for the tests and the benchmarks (``tests/backends/fs/test_direct.py``,
``bench/ttft_phases.py``, which puts this folder on ``sys.path`` as other
benchmarks do).  A file is fsynced first: ``POSIX_FADV_DONTNEED`` drops clean
pages only.
"""

from __future__ import annotations

import os

__all__ = ["drop_file", "drop_page_cache"]


def drop_file(path: str | os.PathLike[str]) -> None:
    """Drop ``path`` from the page cache: fsync, then ``POSIX_FADV_DONTNEED``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_page_cache(root: str | os.PathLike[str], suffix: str = "") -> None:
    """Drop every file under ``root`` whose name ends with ``suffix`` from the page cache."""
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(suffix):
                drop_file(os.path.join(folder, name))
