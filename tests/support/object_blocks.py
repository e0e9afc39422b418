"""Numbered blocks for the ``object`` tier's tests, and the opener type of their fixture.

Block ``i`` is the key ``i`` (eight bytes) followed by a module's suffix, and
1000 bytes seeded by ``i``; the ``open_object`` fixture that opens instances
under one prefix of a test's is in ``tests/backends/object/conftest.py``.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from kvtier.plugins.registry import BackendHandle

Opener = Callable[..., BackendHandle]


def blob(i: int, size: int = 1000) -> bytes:
    return random.Random(i).randbytes(size)


class Blocks:
    """The blocks of one test module, told from another module's by the keys' suffix."""

    def __init__(self, suffix: bytes) -> None:
        self.suffix = suffix

    def key(self, i: int) -> bytes:
        return i.to_bytes(8, "big") + self.suffix

    def exact(self, handle: BackendHandle, ids: list[int]) -> list[int]:
        """The ids whose get returns their exact bytes; a wrong byte fails the test."""
        out = []
        for i, data in zip(ids, handle.get([self.key(i) for i in ids]), strict=True):
            if data is not None:
                assert bytes(data) == blob(i), i
                out.append(i)
        return out
