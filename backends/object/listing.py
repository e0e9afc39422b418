"""The ``object`` backend's LISTs: the names it writes, read back from a listing.

Layout: ``<prefix>/<namespace>/<hex[0:2]>/<hex>``.  Only such names are
taken from a LIST (anything else in the bucket is not a block of this
backend); a page holds 1000 objects, S3's most.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import obstore
from obstore.store import S3Store

from kvtier.spec import ScanEntry

__all__ = ["NAMESPACE_RE", "Listed", "list_names", "scan_entries"]

NAMESPACE_RE = re.compile(r"^[0-9a-f]{32}$")
_NAME_RE = re.compile(r"^(?:[0-9a-f]{2}){1,64}$")

#: What a LIST of one namespace found, per object: last-modified epoch, name, key, size.
Listed: TypeAlias = list[tuple[float, str, bytes, int]]


def list_names(store: S3Store, prefix: str, limit: int | None,
               stop: Callable[[], bool]) -> tuple[Listed, bool]:
    """The blocks under ``prefix`` (a namespace's, ending in ``/``), up to ``limit``
    (None: all), until ``stop()`` says so after a page; and whether it listed all."""
    listed: Listed = []
    for chunk in obstore.list(store, prefix, chunk_size=1000):
        for meta in chunk:
            rel = meta["path"][len(prefix) :].split("/")
            # only names this backend writes: <hex[0:2]>/<hex>
            if len(rel) == 2 and _NAME_RE.match(rel[1]) and rel[0] == rel[1][:2]:
                key = bytes.fromhex(rel[1])
                listed.append((meta["last_modified"].timestamp(), rel[1], key, meta["size"]))
        if (limit is not None and len(listed) >= limit) or stop():
            return listed, False
    return listed, True


def scan_entries(chunk: Sequence[Any], base: str) -> list[ScanEntry]:
    """A LIST page's blocks of every namespace under ``base`` (the prefix and ``/``)."""
    batch = []
    for meta in chunk:
        rel = meta["path"][len(base):].split("/")
        # only names this backend writes: <namespace>/<hex[0:2]>/<hex>
        if (len(rel) == 3 and NAMESPACE_RE.match(rel[0]) and _NAME_RE.match(rel[2])
                and rel[1] == rel[2][:2]):
            batch.append(ScanEntry(rel[0], bytes.fromhex(rel[2]), int(meta["size"]),
                                   meta["last_modified"].timestamp()))
    return batch
