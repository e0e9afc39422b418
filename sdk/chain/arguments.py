"""The chain's arguments checked, with errors that name the real mistake.

A caller's keys must be a sequence of ``bytes`` (one ``bytes`` object is a
sequence too, of ints: it is refused as such), blocks and output buffers
bytes-like, contiguous, one per key, and output buffers writable.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvtier.spec import MAX_KEY_SIZE

__all__ = ["byte_views", "check_keys", "runs_of", "writable"]

#: What a caller passes by mistake where a sequence of them is asked for: one
#: ``bytes`` is a sequence too, of ints.
_ONE_BUFFER = (bytes, bytearray, memoryview, str)


def _sequence(items: Any, what: str, of: str) -> list[Any]:
    if isinstance(items, _ONE_BUFFER) or not isinstance(items, Iterable):
        raise TypeError(f"{what} must be a sequence of {of}, got {type(items).__name__}")
    return list(items)


def check_keys(keys: Sequence[bytes]) -> list[bytes]:
    out = _sequence(keys, "keys", "bytes")
    for i, key in enumerate(out):
        if not isinstance(key, bytes):
            raise TypeError(f"keys[{i}] must be bytes, got {type(key).__name__}")
        if not 0 < len(key) <= MAX_KEY_SIZE:
            raise ValueError(f"keys must be 1 to {MAX_KEY_SIZE} bytes long, got {len(key)}")
    return out


def byte_views(
    blocks: Sequence[Any], n: int, what: str = "blocks", noun: str = "blocks"
) -> list[memoryview]:
    """Each block as a flat byte view; a TypeError names the first that is not bytes-like."""
    items = _sequence(blocks, what, "bytes-like objects")
    if len(items) != n:
        raise ValueError(f"got {len(items)} {noun} for {n} keys")
    views = []
    for i, block in enumerate(items):
        try:
            view = memoryview(block)
        except TypeError:
            raise TypeError(
                f"{what}[{i}] must be a bytes-like object, got {type(block).__name__}"
            ) from None
        if not view.c_contiguous:
            raise TypeError(f"{what}[{i}] must be contiguous in memory")
        views.append(view.cast("B") if view.format != "B" or view.ndim != 1 else view)
    return views


def writable(buffers: Sequence[Any], n: int) -> list[memoryview]:
    views = byte_views(buffers, n, "out", "output buffers")
    for i, view in enumerate(views):
        if view.readonly:
            raise TypeError(f"out[{i}] must be writable (bytearray, numpy array, ...)")
    return views


def runs_of(sizes: Sequence[int], limit: int) -> list[tuple[int, int]]:
    """A batch split into runs of about ``limit`` bytes: ``[lo, hi)`` index pairs
    (a run holds at least one item, however large)."""
    if sum(sizes) <= limit:
        return [(0, len(sizes))]
    runs: list[tuple[int, int]] = []
    lo = total = 0
    for i, size in enumerate(sizes):
        if i > lo and total + size > limit:
            runs.append((lo, i))
            lo, total = i, 0
        total += size
    runs.append((lo, len(sizes)))
    return runs
