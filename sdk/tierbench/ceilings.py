"""The raw ceilings ``kvtier bench`` sets beside each tier: its medium with no kvtier.

Each :class:`Raw` stores and reads the same blocks as the tier, in the same
rounds, the plainest way its medium allows: ``memcpy`` for ``host``, one
file per block for ``fs``, ``obstore`` calls for ``object``, a plain socket
for ``peer``.
"""

from __future__ import annotations

import mmap
import os
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = [
    "FileRaw",
    "MemcpyRaw",
    "ObstoreRaw",
    "PeerRaw",
    "Raw",
    "drop_page_cache",
    "warm_page_cache",
]


class Raw:
    """The medium without kvtier: what a tier's figures are compared with."""

    label = "raw"
    #: Operations whose figures this ceiling reports (it runs both: a get needs the data).
    reports: tuple[str, ...] = ("put", "get")

    def put(self, names: list[str], blocks: list[memoryview]) -> None:
        raise NotImplementedError

    def get(self, names: list[str], outs: list[memoryview]) -> None:
        raise NotImplementedError

    def clear(self, names: list[str]) -> None:
        """Drop what a round stored (untimed)."""

    def close(self) -> None:
        """Release the medium."""


class MemcpyRaw(Raw):
    label = "memcpy"

    def __init__(self) -> None:
        self.slots: dict[str, bytearray] = {}
        self.spare: list[bytearray] = []
        # first use is timed in a child process, beside the tier there (kvtier.tierbench.first)
        self.reports = ("put", "get", "put-first", "get-first")

    def prepare(self, count: int, size: int) -> None:
        # preallocated and touched, so the copy never pays for page faults
        self.spare = [bytearray(b"\1" * size) for _ in range(count)]

    def put(self, names: list[str], blocks: list[memoryview]) -> None:
        for name, block, slot in zip(names, blocks, self.spare):
            slot[:] = block
            self.slots[name] = slot

    def get(self, names: list[str], outs: list[memoryview]) -> None:
        for name, out in zip(names, outs):
            out[:] = self.slots[name]

    def clear(self, names: list[str]) -> None:
        for name in names:
            self.slots.pop(name, None)


class FileRaw(Raw):
    """One file per block; ``direct`` writes and reads with O_DIRECT through an aligned
    buffer (the blocks are ``bytes``, which O_DIRECT cannot take as they are)."""

    def __init__(self, root: Path, fsync: bool, direct: bool = False) -> None:
        self.root, self.fsync, self.direct = root, fsync, direct
        self.label = "file I/O O_DIRECT" if direct else "file I/O"
        self.reports = ("put", "get", "get-uncached")
        self.scratch: memoryview | None = None
        root.mkdir(parents=True, exist_ok=True)

    def _aligned(self, size: int) -> memoryview:
        aligned = -(-size // 4096) * 4096
        if self.scratch is None or self.scratch.nbytes < aligned:
            self.scratch = memoryview(mmap.mmap(-1, aligned))  # page aligned, as O_DIRECT wants
        return self.scratch[:aligned]

    def put(self, names: list[str], blocks: list[memoryview]) -> None:
        # a temp file renamed into place: the least any store that readers may
        # share while it writes must do, so that no one reads half a block
        for name, block in zip(names, blocks):
            tmp = self.root / f".tmp-{name}"
            if self.direct:
                self._put_direct(tmp, block)
            else:
                with open(tmp, "wb") as f:
                    f.write(block)
                    if self.fsync:
                        f.flush()
                        os.fsync(f.fileno())
            os.rename(tmp, self.root / name)
        if self.fsync:
            fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _put_direct(self, tmp: Path, block: memoryview) -> None:
        size = block.nbytes
        view = self._aligned(size)
        view[:size] = block
        view[size:] = bytes(view.nbytes - size)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0))
        try:
            os.write(fd, view)
            if view.nbytes != size:
                os.ftruncate(fd, size)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def get(self, names: list[str], outs: list[memoryview]) -> None:
        if self.direct:
            self._get_direct(names, outs)
            return
        for name, out in zip(names, outs):
            with open(self.root / name, "rb", buffering=0) as f:
                f.readinto(out)

    def _get_direct(self, names: list[str], outs: list[memoryview]) -> None:
        view = self._aligned(outs[0].nbytes)
        for name, out in zip(names, outs):
            fd = os.open(self.root / name, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            try:
                got = os.readv(fd, [view])
            finally:
                os.close(fd)
            out[:] = view[: min(got, out.nbytes)]

    def drop_cache(self, names: list[str]) -> None:
        drop_page_cache([self.root / name for name in names])

    def warm_cache(self, names: list[str]) -> None:
        warm_page_cache([self.root / name for name in names])

    def clear(self, names: list[str]) -> None:
        for name in names:
            (self.root / name).unlink(missing_ok=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def warm_page_cache(paths: Sequence[Path]) -> None:
    """Put files in the page cache the way a read does: dropped, then read once.

    A tier that writes with ``O_DIRECT`` leaves nothing in the cache, a plain
    ``write`` leaves everything, and the two do not read back alike: here a
    file cached by its write came back at 2.0 ms per 16 x 2 MiB, the same
    files cached by a read at 5.0-6.6 ms (the page cache holds what a write
    made in larger pieces).  So a cached read is compared with a cached read
    only once both sides' files were cached the same way (untimed).
    """
    drop_page_cache(paths)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


def drop_page_cache(paths: Sequence[Path]) -> None:
    """Push files out of the page cache: flushed first, since only clean pages are dropped."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class ObstoreRaw(Raw):
    """Plain obstore calls; ``concurrency`` > 1 runs them on that many threads."""

    def __init__(self, options: dict[str, Any], prefix: str, concurrency: int) -> None:
        import obstore
        from obstore.store import S3Store

        self.obstore = obstore
        config: dict[str, Any] = {"region": options.get("region") or "us-east-1"}
        for key in ("endpoint", "access_key_id", "secret_access_key"):
            if options.get(key):
                config[key] = options[key]
        endpoint = options.get("endpoint") or ""
        allow_http = options.get("allow_http")
        self.store = S3Store(
            options["bucket"], config=config,  # type: ignore[arg-type]
            client_options={"allow_http": endpoint.startswith("http://")
                            if allow_http is None else bool(allow_http)})
        self.prefix = prefix
        self.concurrency = concurrency
        self.label = "obstore" if concurrency == 1 else f"obstore x{concurrency}"
        self.pool = ThreadPoolExecutor(concurrency) if concurrency > 1 else None

    def _each(self, fn: Callable[[int], None], n: int) -> None:
        if self.pool is None:
            for i in range(n):
                fn(i)
        else:
            list(self.pool.map(fn, range(n)))

    def put(self, names: list[str], blocks: list[memoryview]) -> None:
        def one(i: int) -> None:
            self.obstore.put(self.store, f"{self.prefix}/{names[i]}", blocks[i],
                             use_multipart=False)

        self._each(one, len(names))

    def get(self, names: list[str], outs: list[memoryview]) -> None:
        def one(i: int) -> None:
            outs[i][:] = memoryview(self.obstore.get(self.store,
                                                     f"{self.prefix}/{names[i]}").bytes())

        self._each(one, len(names))

    def clear(self, names: list[str]) -> None:
        self.obstore.delete(self.store, [f"{self.prefix}/{n}" for n in names])

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


class PeerRaw(Raw):
    label = "socket"

    def __init__(self) -> None:
        from kvtier.tierbench.servers import RawPeer

        self.peer = RawPeer()

    def put(self, names: list[str], blocks: list[memoryview]) -> None:
        self.peer.put(blocks)

    def get(self, names: list[str], outs: list[memoryview]) -> None:
        self.peer.get(outs)

    def close(self) -> None:
        self.peer.close()
