"""The ``fs`` backend's store on any other fsspec filesystem: object stores, ``memory://``, ...

A block is published with one ``pipe_file``, which object stores (and
``memory://``) make atomic, and read with one ``cat_file``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kvtier.block.buffers import byte_views

from .layout import STALE_TMP_SECONDS, TMP_PREFIX, Entry, Mapper, Store, key_of_name, tmp_name

__all__ = ["RemoteStore", "mtime_of"]


class RemoteStore(Store):
    """Any other fsspec filesystem: object stores, ``memory://``, ..."""

    def __init__(self, fs: Any, nsroot: str) -> None:
        super().__init__(nsroot)
        self.fs = fs
        protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
        self.memory = "memory" in protocols
        # Object stores (s3fs, gcsfs, adlfs: the ones that split paths into
        # bucket and key) need no directories, and their makedirs creates a
        # missing bucket: a misspelt name must fail, not become a new bucket.
        self.buckets = callable(getattr(fs, "split_path", None))

    def create_root(self) -> None:
        if not self.buckets:
            self.fs.makedirs(self.nsroot, exist_ok=True)

    def probe(self) -> None:
        tmp = f"{self.nsroot}/{tmp_name()}"
        self.fs.pipe_file(tmp, b"")
        self.fs.rm_file(tmp)

    def write(self, key: bytes, parts: Sequence[Any], fsync: bool) -> int:
        # No existence check: on an object store it is a round trip, and
        # overwriting an immutable block with the same bytes is harmless.
        # keeping a reference to a bytes block is the one copy the contract wants
        one = len(parts) == 1 and isinstance(parts[0], bytes)
        data = parts[0] if one else b"".join(parts)
        path = self.path(key)
        try:
            self.fs.pipe_file(path, data)
        except FileNotFoundError:
            if self.buckets:
                raise  # the bucket is gone; never recreate it behind the user's back
            # filesystems with real directories (sftp, ...) need the parents
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(path, data)
        return len(data)

    def read(self, key: bytes) -> bytes | None:
        try:
            data: bytes = self.fs.cat_file(self.path(key))
        except FileNotFoundError:
            return None
        return data

    def read_into(self, key: bytes, buffers: Sequence[memoryview]) -> int | None:
        data = self.read(key)
        if data is None:
            return None
        views = byte_views(buffers)
        if len(data) == sum(len(v) for v in views):
            src = memoryview(data)
            offset = 0
            for v in views:
                v[:] = src[offset : offset + len(v)]
                offset += len(v)
        return len(data)

    def size(self, key: bytes) -> int | None:
        try:
            info = self.fs.info(self.path(key))
        except FileNotFoundError:
            return None
        return int(info["size"])

    def remove(self, key: bytes) -> bool:
        # Object stores delete missing keys silently: ask first, so that the
        # answer says whether this call removed something.
        if self.size(key) is None:
            return False
        try:
            self.fs.rm_file(self.path(key))
        except FileNotFoundError:
            return False
        return True

    def rewrite(self, key: bytes, data: bytes) -> bool:
        if self.size(key) is None:
            return False
        self.fs.pipe_file(self.path(key), data)
        return True

    def scan(self, mapper: Mapper[Any, Any]) -> tuple[list[Entry], int]:
        try:
            listing: dict[str, dict[str, Any]] = self.fs.find(self.nsroot, detail=True)
        except FileNotFoundError:
            return [], 0
        now = time.time()
        prefix = self.fs._strip_protocol(self.nsroot).rstrip("/") + "/"
        entries: list[Entry] = []
        stale = 0
        for path, info in listing.items():
            rel = path[len(prefix) :] if path.startswith(prefix) else path
            parts = rel.split("/")
            mtime = mtime_of(info)
            if parts[-1].startswith(TMP_PREFIX):
                if mtime and mtime < now - STALE_TMP_SECONDS:
                    try:
                        self.fs.rm_file(path)
                        stale += 1
                    except FileNotFoundError:
                        pass
                continue
            if len(parts) != 3 or info.get("type", "file") != "file":
                continue
            key = key_of_name(parts[0], parts[1], parts[2])
            if key is not None:
                entries.append(Entry(key, int(info.get("size") or 0), mtime))
        return entries, stale


def mtime_of(info: dict[str, Any]) -> float:
    """Best-effort modification time from an fsspec info dict (names vary by filesystem)."""
    for name in ("mtime", "LastModified", "last_modified", "created", "modified"):
        value = info.get(name)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return float(value)
        timestamp = getattr(value, "timestamp", None)
        if callable(timestamp):
            return float(timestamp())
    return 0.0
