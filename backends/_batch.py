"""What the built-in backends do alike with a hook's batch: byte counts, gather
and scatter lists, first occurrences of a key, failures caught in workers.

Private to ``kvtier.backends``; a backend of another distribution keeps its
own copies rather than import these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from kvtier.block.framing import Frame
from kvtier.spec import BytesLike

__all__ = [
    "Failed",
    "byte_views",
    "copy_bytes",
    "first_positions",
    "joined",
    "nbytes",
    "own",
    "parts_nbytes",
    "scatter",
]

E = TypeVar("E", bound=BaseException)
#: Below this, copying with the GIL held costs less than entering numpy.
_SMALL_COPY = 64 << 10


class Failed(Generic[E]):
    """An exception caught in a worker thread, re-raised by the calling thread."""

    __slots__ = ("exc",)

    def __init__(self, exc: E) -> None:
        self.exc = exc


def nbytes(block: BytesLike) -> int:
    # len() of a memoryview counts items, not bytes
    return block.nbytes if isinstance(block, memoryview) else len(block)


def parts_nbytes(parts: Sequence[BytesLike]) -> int:
    if isinstance(parts, Frame):
        return parts.nbytes  # known before its header, and the checksum, is made
    return sum(nbytes(part) for part in parts)


def own(block: BytesLike) -> bytes:
    # bytes is immutable, so holding the caller's object is as good as a copy
    return block if type(block) is bytes else bytes(block)


def joined(parts: Sequence[BytesLike]) -> bytes:
    """The block a gather list stands for, as ``bytes`` the caller may keep."""
    if len(parts) == 1 and isinstance(parts[0], bytes):
        return parts[0]
    return b"".join(parts)


def byte_views(parts: Sequence[Any]) -> list[Any]:
    """The non-empty buffers of a gather/scatter list, each sized in bytes.

    bytes and bytearray pass through as they are; anything else becomes a
    memoryview cast to unsigned bytes, so that len() counts bytes even for,
    say, a float16 array's view.
    """
    out = []
    for p in parts:
        if type(p) is not bytes and type(p) is not bytearray:
            p = memoryview(p).cast("B")
        if len(p):
            out.append(p)
    return out


def scatter(src: BytesLike, buffers: Sequence[Any], size: int | None = None) -> None:
    """Copy the first ``size`` bytes of ``src`` (all of it by default) across ``buffers``."""
    with memoryview(src) as whole:
        view = whole.cast("B")
        end = view.nbytes if size is None else size
        offset = 0
        for buf in byte_views(buffers):
            n = min(len(buf), end - offset)
            if n <= 0:
                break
            copy_bytes(view[offset : offset + n], memoryview(buf)[:n])
            offset += n


def copy_bytes(src: memoryview, dst: memoryview) -> None:
    """``dst[:] = src`` for byte views of one length, without the GIL for large ones."""
    if len(src) < _SMALL_COPY:
        dst[:] = src
    else:
        np.copyto(np.frombuffer(dst, dtype=np.uint8), np.frombuffer(src, dtype=np.uint8))


def first_positions(keys: Sequence[bytes]) -> dict[bytes, int]:
    """Each distinct key of a batch and where it first occurs, in batch order."""
    first: dict[bytes, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    return first
