"""``kvtier_scan`` for the ``fs`` backend: list blocks of one namespace or all of them.

Walks the layout of :mod:`kvtier.backends.fs.layout`
(``<root>/<namespace>/<hex[0:2]>/<hex[2:4]>/<hex>.kvb``) without touching
anything: unlike the scan at open, temp files are neither listed nor removed,
and files that are not blocks of this layout are left out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import Any

from kvtier.spec import ConfigError, ScanEntry

from .layout import FAN_RE, NAMESPACE_RE, Store, key_of_name
from .readonly import local_or_remote
from .remote import RemoteStore, mtime_of

__all__ = ["SCAN_BATCH", "scan_local", "scan_remote", "scan_store"]

#: Entries per batch handed to the caller.
SCAN_BATCH = 1024


def scan_store(
    store: Store, namespace: str | None, check: Callable[[], None]
) -> Iterator[list[ScanEntry]]:
    """The blocks of ``namespace`` (all namespaces if None) beside ``store``'s own."""
    if namespace is not None and not NAMESPACE_RE.match(namespace):
        raise ConfigError(f"expected 32 lowercase hex digits, got {namespace!r}",
                          key="namespace")
    root = store.nsroot.rsplit("/", 1)[0]  # the namespaces' parent: the tier's URL
    store = local_or_remote(store)
    if isinstance(store, RemoteStore):
        return scan_remote(store.fs, root, namespace, check)
    return scan_local(root, namespace, check)


def _dirs(path: str, pattern: re.Pattern[str]) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return sorted(
                (e for e in it if pattern.match(e.name) and e.is_dir(follow_symlinks=False)),
                key=lambda e: e.name,
            )
    except (FileNotFoundError, NotADirectoryError):
        return []


def scan_local(
    root: str, namespace: str | None, check: Callable[[], None]
) -> Iterator[list[ScanEntry]]:
    """Blocks under a local ``root``; ``check`` runs before each batch (raises once closed)."""
    spaces = [e.name for e in _dirs(root, NAMESPACE_RE)] if namespace is None else [namespace]
    batch: list[ScanEntry] = []
    for ns in spaces:
        for first in _dirs(os.path.join(root, ns), FAN_RE):
            for second in _dirs(first.path, FAN_RE):
                try:
                    with os.scandir(second.path) as it:
                        files = list(it)
                except FileNotFoundError:
                    continue
                for f in files:
                    key = key_of_name(first.name, second.name, f.name)
                    if key is None or not f.is_file(follow_symlinks=False):
                        continue
                    try:
                        st = f.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # evicted meanwhile
                    batch.append(ScanEntry(ns, key, st.st_size, st.st_mtime))
                if len(batch) >= SCAN_BATCH:
                    check()
                    yield batch
                    batch = []
    check()
    if batch:
        yield batch


def scan_remote(
    fs: Any, root: str, namespace: str | None, check: Callable[[], None]
) -> Iterator[list[ScanEntry]]:
    """Blocks under ``root`` of an fsspec filesystem, from one recursive listing."""
    base = root if namespace is None else f"{root}/{namespace}"
    try:
        listing: dict[str, dict[str, Any]] = fs.find(base, detail=True)
    except FileNotFoundError:
        return
    prefix = fs._strip_protocol(root).rstrip("/") + "/"
    batch: list[ScanEntry] = []
    for path in sorted(listing):
        info = listing[path]
        parts = (path[len(prefix):] if path.startswith(prefix) else path).split("/")
        if len(parts) != 4 or not NAMESPACE_RE.match(parts[0]):
            continue
        if info.get("type", "file") != "file":
            continue
        key = key_of_name(parts[1], parts[2], parts[3])
        if key is None:
            continue
        mtime = mtime_of(info)
        batch.append(ScanEntry(parts[0], key, int(info.get("size") or 0), mtime or None))
        if len(batch) >= SCAN_BATCH:
            check()
            yield batch
            batch = []
    check()
    if batch:
        yield batch
