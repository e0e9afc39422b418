"""An ``fs`` tier opened with ``read_only: true``: it reads blocks and writes nothing.

Operators look at a root with ``kvtier inspect``, or ``kvtier scrub`` without
``--repair``, and expect a look to leave the root as it was, also on a
read-only mount.  An ordinary open writes: it makes the namespace directory,
probes with a temp file, opens (or creates) the pool's index
``.kvtier-pool.db``, removes stale temp files, and rewrites ``index.kvi`` at
close.  :class:`ReadOnlyStore` wraps the store a URL gets and answers each
of those without I/O that writes:

- the root must exist and be readable (checked at open, by listing it);
- it is neither a :class:`~kvtier.backends.fs.local.LocalStore` nor a pool
  store, so the backend attaches no pool and neither reads nor saves
  ``index.kvi``;
- its tree scan at open finds nothing: the backend's index starts empty and
  learns blocks as they are read (a lookup still stats the file);
- writes, removals and rewrites change nothing (the backend answers puts
  ``False`` before they reach it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

from kvtier.spec import BackendError

from .layout import Entry, Mapper, Store
from .remote import RemoteStore

__all__ = ["ReadOnlyStore", "local_or_remote"]


class ReadOnlyStore(Store):
    """``inner``'s reads; its writes refused without touching the root.

    Deliberately not a :class:`~kvtier.backends.fs.local.LocalStore`, even
    around one: the backend gives those the pool and the index file.
    """

    def __init__(self, inner: Store, shown: str) -> None:
        super().__init__(inner.nsroot)
        self.inner, self.shown = inner, shown
        self.local, self.memory = inner.local, inner.memory
        self.root = inner.nsroot.rsplit("/", 1)[0]

    def create_root(self) -> None:
        """Nothing is made: the root must be there and readable."""
        try:
            self.probe_read()
        except Exception as exc:
            raise BackendError(f"fs tier {self.shown}: cannot read {self.root} "
                               f"(read_only: true): {exc}") from exc

    def probe(self) -> None:
        self.probe_read()

    def probe_read(self) -> None:
        # the root, not the namespace's directory: a namespace never written has none
        if isinstance(self.inner, RemoteStore):
            # an object store's prefix exists once a block is under it
            with contextlib.suppress(FileNotFoundError):
                self.inner.fs.ls(self.root)
        else:
            os.listdir(self.root)

    def write(self, key: bytes, parts: Sequence[Any], fsync: bool) -> int:
        raise BackendError(f"fs tier {self.shown}: opened read-only")

    def read(self, key: bytes) -> bytes | None:
        return self.inner.read(key)

    def read_into(self, key: bytes, buffers: Sequence[memoryview]) -> int | None:
        return self.inner.read_into(key, buffers)

    def size(self, key: bytes) -> int | None:
        return self.inner.size(key)

    def remove(self, key: bytes) -> bool:
        return False

    def rewrite(self, key: bytes, data: bytes) -> bool:
        return False

    def scan(self, mapper: Mapper[Any, Any]) -> tuple[list[Entry], int]:
        return [], 0


def local_or_remote(store: Store) -> Store:
    """The store :mod:`.scan` lists: the one a read-only store wraps."""
    return store.inner if isinstance(store, ReadOnlyStore) else store

