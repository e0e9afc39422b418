"""The codec stage of a block: byte-shuffle and zstd, and the checks of a zstd frame's sizes.

Private to :mod:`~kvtier.block.framing`, which records what these did in a
block's header.  Decoding never trusts a size the frame claims beyond what
the checked header allows.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import zstandard

from kvtier.spec import BytesLike, CorruptBlockError

# a zstd block of up to 128 KiB of output takes at least 4 bytes (an RLE block),
# so no frame expands more than this: bounds what a header may make us allocate
MAX_ZSTD_RATIO = 1 << 15

_local = threading.local()  # zstd contexts are not safe to share between threads


def compressor(level: int) -> Any:
    cache: dict[int, Any] = _local.__dict__.setdefault("compressors", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level)
    return cache[level]


def decompressor() -> Any:
    if not hasattr(_local, "decompressor"):
        _local.decompressor = zstandard.ZstdDecompressor()
    return _local.decompressor


def shuffle_bytes(payload: BytesLike, width: int) -> bytes:
    """Group byte ``j`` of every element together: exponent bytes compress well."""
    data = np.frombuffer(payload, dtype=np.uint8)
    whole = len(data) - len(data) % width
    body = data[:whole].reshape(-1, width).T.tobytes()
    return body + data[whole:].tobytes()


def unshuffle_into(shuffled: BytesLike, width: int, out: memoryview) -> None:
    src = np.frombuffer(shuffled, dtype=np.uint8)
    dst = np.frombuffer(out, dtype=np.uint8)
    whole = len(src) - len(src) % width
    dst[:whole].reshape(-1, width)[:] = src[:whole].reshape(width, -1).T
    dst[whole:] = src[whole:]


def check_zstd_sizes(stored: memoryview, stored_len: int, raw_len: int) -> None:
    """Refuse a raw length no frame of this size can produce, before anyone allocates it.

    Callers size buffers from ``raw_len`` right after parsing; the header is
    not under the checksum, so a flipped bit there must not become a huge
    allocation.  With the payload at hand the frame's own size is compared too.
    """
    if raw_len > stored_len * MAX_ZSTD_RATIO:
        raise CorruptBlockError(f"raw length {raw_len} is impossible for {stored_len} stored")
    if stored.nbytes == stored_len:
        try:
            size = zstandard.frame_content_size(stored)
        except zstandard.ZstdError as exc:
            raise CorruptBlockError(f"zstd: {exc}") from None
        if size != raw_len:
            raise CorruptBlockError("zstd frame size differs from header")


def unpack_into(stored: memoryview, raw_len: int, shuffle: int, out: memoryview) -> None:
    raw = decompress(stored, raw_len)
    if shuffle:
        unshuffle_into(raw, shuffle, out)
    else:
        out[:] = raw


def decompress(stored: memoryview, raw_len: int) -> bytes:
    """The zstd frame ``stored`` decompressed, still shuffled; a bad frame is corrupt."""
    try:
        # a frame may claim any size; allocate only what the checked header allows
        if zstandard.frame_content_size(stored) != raw_len:
            raise CorruptBlockError("zstd frame size differs from header")
        raw: bytes = decompressor().decompress(stored, max_output_size=raw_len)
    except zstandard.ZstdError as exc:
        raise CorruptBlockError(f"zstd: {exc}") from None
    if len(raw) != raw_len:
        raise CorruptBlockError("decompressed length differs from header")
    return raw


def unshuffle(raw: bytes, width: int) -> bytes:
    """Bytes shuffled by :func:`shuffle_bytes` with ``width``, in their first order."""
    data = np.frombuffer(raw, dtype=np.uint8)
    whole = len(data) - len(data) % width
    body = data[:whole].reshape(width, -1).T.tobytes()
    return body + data[whole:].tobytes() if whole < len(data) else body
