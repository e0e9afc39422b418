"""Each writer process of the ``fs`` pool (:mod:`kvtier.backends.fs.pool`): whether it is
alive, and its journal, ``<root>/.kvtier-pool.db.writer-<id>``: the keys a process may
be writing from its credit, appended before their files are written, so that the
files of a process that died can be counted (:mod:`.pool_dead`).

A process is dead when its pid is: the sharers of a root share one pid namespace
(roots on network filesystems get no pool, :mod:`.mounts`).
"""

from __future__ import annotations

import contextlib
import os

from .pool_options import DB_NAME

__all__ = ["JOURNAL_MAX", "JOURNAL_PREFIX", "Journal", "alive", "journal_keys", "journal_path"]

JOURNAL_PREFIX = f"{DB_NAME}.writer-"  # and the writer's id
#: A journal is emptied once it is longer (and none of its keys is in flight): the
#: capacity counts it (:mod:`.pool_files`), a long one leaves less room for blocks.
JOURNAL_MAX = 16 << 10


def alive(writer: str) -> bool:
    try:
        os.kill(int(writer.split(":", 1)[0]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def journal_path(root: str, writer: str) -> str:
    """The file where ``writer`` lists the keys it may be writing (see :class:`SharedPool`)."""
    return os.path.join(root, JOURNAL_PREFIX + writer.replace(":", "-"))


def journal_keys(path: str) -> set[bytes]:
    """The keys a journal lists; a line that is not a key (torn by a crash) is skipped."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return set()
    keys = set()
    for line in lines:
        with contextlib.suppress(ValueError):
            keys.add(bytes.fromhex(line.decode("ascii")))
    keys.discard(b"")
    return keys


class Journal:
    """One process's journal: appended before the files it names are written, emptied
    once every key it lists has its row, deleted at close.  Not thread-safe: the pool's
    lock is held for each call."""

    def __init__(self, root: str, writer: str) -> None:
        self.path = journal_path(root, writer)
        self.fd = -1
        self.length = 0  # bytes appended since it was last emptied

    def append(self, keys: list[bytes]) -> None:
        lines = b"".join(key.hex().encode() + b"\n" for key in keys)
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                              0o644)
        self.length += len(lines)
        os.write(self.fd, lines)  # one O_APPEND write of a few lines

    def settled(self) -> None:
        """None of the keys listed is in flight any more: empty it if it is long."""
        if self.length > JOURNAL_MAX:
            os.ftruncate(self.fd, 0)
            self.length = 0

    def remove(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
