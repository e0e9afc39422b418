"""The ``host`` backend (RAM tier) opened through the registry, and the blocks its tests store.

``tests/backends/host/test_*.py`` drive the backend through the registry and
:class:`BackendHandle`; the ``host`` fixture (one open backend per eviction
policy) is in ``tests/backends/conftest.py``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from kvtier.plugins.registry import BackendHandle, default_registry
from kvtier.policies import NAMES
from kvtier.spec import BytesLike

NS = "0123456789abcdef0123456789abcdef"
MiB = 1024 * 1024
POLICIES = NAMES  # every registered policy: the host tier offers them all


def open_host(capacity: int | str, eviction: str = "lru", *, ns: str = NS,
              **extra: object) -> BackendHandle:
    handle = default_registry().create("host")
    handle.open({"capacity": capacity, "eviction": eviction, **extra}, ns)
    return handle


def block(key: bytes, size: int, version: int = 0) -> bytes:
    """Deterministic pseudo-random content, different per key and version."""
    return random.Random(key + b"/" + str(version).encode()).randbytes(size)


def k(i: int | str) -> bytes:
    return f"key-{i}".encode()


def resident(handle: BackendHandle, keys: Sequence[bytes]) -> set[bytes]:
    return {key for key, hit in zip(keys, handle.lookup(keys), strict=True) if hit}


class PaperModel(Protocol):
    """A policy as its paper writes it, on blocks of one size: ``put`` appends what it evicts."""

    def put(self, key: bytes, evicted: list[bytes], /) -> None: ...


def put_as_the_paper_does(handle: BackendHandle, paper: PaperModel, keys: list[bytes],
                          size: int) -> None:
    """Puts ``keys`` (each block its key padded to ``size``) into the tier and into ``paper``:
    the tier must evict the blocks the paper evicts, in its order, and hand back their bytes."""
    got: list[tuple[bytes, BytesLike]] = []
    handle.put(keys, [key.ljust(size, b".") for key in keys], got)
    want: list[bytes] = []
    for key in dict.fromkeys(keys):  # a key repeated in one put counts once
        paper.put(key, want)
    evicted = [key for key, _ in got]
    assert evicted == want, (evicted, want)
    assert all(bytes(data) == key.ljust(size, b".") for key, data in got), evicted
