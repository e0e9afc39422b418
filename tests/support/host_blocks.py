"""The ``host`` backend (RAM tier) opened through the registry, and the blocks its tests store.

``tests/backends/host/test_*.py`` drive the backend through the registry and
:class:`BackendHandle`; the ``host`` fixture (one open backend per eviction
policy) is in ``tests/backends/conftest.py``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvtier.plugins.registry import BackendHandle, default_registry
from kvtier.policies import NAMES

NS = "0123456789abcdef0123456789abcdef"
MiB = 1024 * 1024
POLICIES = NAMES  # every registered policy: the host tier offers them all


def open_host(capacity: int | str, eviction: str = "lru", **extra: object) -> BackendHandle:
    handle = default_registry().create("host")
    handle.open({"capacity": capacity, "eviction": eviction, **extra}, NS)
    return handle


def block(key: bytes, size: int, version: int = 0) -> bytes:
    """Deterministic pseudo-random content, different per key and version."""
    return random.Random(key + b"/" + str(version).encode()).randbytes(size)


def k(i: int | str) -> bytes:
    return f"key-{i}".encode()


def resident(handle: BackendHandle, keys: Sequence[bytes]) -> set[bytes]:
    return {key for key, hit in zip(keys, handle.lookup(keys), strict=True) if hit}
