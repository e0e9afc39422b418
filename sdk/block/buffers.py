"""A block's buffers: byte counts, gather and scatter lists, and copies.

What a backend does alike with the blocks and buffers of a batch, public for
every backend, built-in or of another distribution:

* :func:`nbytes` and :func:`parts_nbytes` count bytes (``len`` of a
  memoryview counts items, and a :class:`~kvtier.block.framing.Frame` knows
  its size before its header is made);
* :func:`own` and :func:`joined` give ``bytes`` a backend may keep;
* :func:`byte_views` and :func:`scatter` walk a gather or scatter list
  (``kvtier_put_parts``, ``kvtier_get_into``) byte by byte;
* :func:`copy_bytes` copies a large buffer without holding the GIL;
* :func:`landed` tells a scatter list its block is in, so that what the
  tier does with it next (open a sealed block) runs in the reading thread.

They are here, not in :mod:`kvtier.spec`, because they know the chain's
frame and use numpy, and the spec imports nothing.  The helpers for a
hook's batch as a whole (its length check, first occurrences of a key, a
batch over threads) are :mod:`kvtier.spec.batch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kvtier.block.framing import Frame
from kvtier.spec import BytesLike

__all__ = [
    "byte_views",
    "copy_bytes",
    "joined",
    "landed",
    "nbytes",
    "own",
    "parts_nbytes",
    "scatter",
]

#: Below this, copying with the GIL held costs less than entering numpy.
_SMALL_COPY = 64 << 10


def nbytes(block: BytesLike) -> int:
    """Size of ``block`` in bytes."""
    # len() of a memoryview counts items, not bytes
    return block.nbytes if isinstance(block, memoryview) else len(block)


def parts_nbytes(parts: Sequence[BytesLike]) -> int:
    """Size in bytes of the block a gather list stands for, without joining it."""
    if isinstance(parts, Frame):
        return parts.nbytes  # known before its header, and the checksum, is made
    return sum(nbytes(part) for part in parts)


def own(block: BytesLike) -> bytes:
    """``block`` as ``bytes`` a backend may keep after the call (no copy of ``bytes``)."""
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


def landed(buffers: Sequence[Any]) -> None:
    """Tell the scatter list ``buffers`` its block was read into it whole.

    A backend that reads a batch in worker threads calls it in the thread
    that read the block, before its ``get_into`` returns: a sealed block's
    list (:class:`~kvtier.block.sealed.SealedScatter`) is then opened there,
    beside the other threads' reads, not after the batch in the calling
    thread.  A no-op for any other list; a backend that never calls it
    loses nothing but that overlap (the tier opens the block itself).
    """
    hook = getattr(buffers, "landed", None)
    if hook is not None:
        hook()
