"""Ground truth for the conformance kit: blocks whose bytes follow from their key.

Every block the kit stores is ``block_for(key, size)``, so any block a backend
hands back can be checked without remembering it: from another thread, from
another process (the crash-safety child), after a reopen.  The bytes are
pseudo-random (a backend that compresses or dedups sees realistic data), and
each 64 KiB chunk carries its own index so that a block served with chunks
swapped, shifted or cut short never equals the truth.

This module imports nothing from kvtier: the kit's model of a correct answer
must not share code with what it checks.
"""

from __future__ import annotations

import hashlib
import random

__all__ = [
    "CHUNK",
    "KIB",
    "MIB",
    "block_for",
    "crash_key",
    "crash_plan",
    "crash_size",
    "describe",
    "key_of",
    "shown",
    "size_for",
]

KIB = 1024
MIB = 1024 * KIB
#: Blocks are built from pseudo-random chunks of this size.
CHUNK = 64 * KIB

# Sizes ``size_for`` picks from: odd sizes catch off-by-one framing, the
# larger ones cross typical buffer and page boundaries.
_SIZES = (1, 7, 100, 4096, 4097, 65_536 + 3, 300_001)


def block_for(key: bytes, size: int) -> bytes:
    """The only bytes the kit ever stores under ``key`` with length ``size``."""
    seed = hashlib.blake2b(key + size.to_bytes(8, "little"), digest_size=32).digest()
    chunk = random.Random(seed).randbytes(min(size, CHUNK))
    if size <= CHUNK:
        return chunk
    out = bytearray(chunk * (size // CHUNK + 1))
    del out[size:]
    # stamp each chunk with its index: a repeated chunk alone would not show
    # a backend that serves the right bytes at the wrong offset
    for index in range(1, (size + CHUNK - 1) // CHUNK):
        start = index * CHUNK
        stamp = index.to_bytes(8, "little")[: size - start]
        out[start : start + len(stamp)] = stamp
    return bytes(out)


def size_for(key: bytes, limit: int | None = None) -> int:
    """A size derived from ``key`` alone (so any thread can check a hit), at most ``limit``."""
    size = _SIZES[hashlib.blake2b(key, digest_size=2).digest()[0] % len(_SIZES)]
    return size if limit is None else max(1, min(size, limit))


def key_of(tag: str, index: int) -> bytes:
    """A readable key: ``b"kit/<tag>/<index>"``."""
    return f"kit/{tag}/{index}".encode()


def crash_key(prefix: str, index: int) -> bytes:
    """Key ``index`` written by the crash-safety child for round ``prefix``."""
    return f"crash/{prefix}/{index:08d}".encode()


def crash_size(index: int, limit: int) -> int:
    """Size of crash block ``index``: varied from 1 byte to a few MiB, at most ``limit``."""
    sizes = (3 * MIB + 17, 1, 4096, 1 * MIB, 65_536, 2 * MIB - 1, 100, 512 * KIB + 5)
    return max(1, min(sizes[index % len(sizes)], limit))


def crash_plan(limit: int) -> list[list[tuple[int, int]]]:
    """The puts of a steps writer: per put, ``(index, size)`` of its blocks, at most ``limit``.

    A large block alone, a small one beside a medium one, then a large one:
    each put's I/O differs, and the sizes cross buffer and page boundaries.
    """
    sizes = [[256 * KIB + 5], [100, 65_536 + 3], [MIB + 17]]
    plan: list[list[tuple[int, int]]] = []
    index = 0
    for batch in sizes:
        plan.append([(index + i, max(1, min(size, limit))) for i, size in enumerate(batch)])
        index += len(batch)
    return plan


def shown(blocks: list[bytes | None]) -> str:
    """Blocks as a message shows them: their lengths, not their bytes."""
    return "[" + ", ".join("None" if b is None else f"{len(b)} bytes" for b in blocks) + "]"


def describe(expected: bytes | None, got: bytes | None) -> str:
    """A short description of how ``got`` differs from ``expected``, for messages."""
    if got is None:
        return "a miss" if expected is not None else "a miss, as expected"
    if expected is None:
        return f"{len(got)} bytes where a miss was expected"
    if got == expected:
        return "the expected bytes"
    if len(got) != len(expected):
        return f"{len(got)} bytes where {len(expected)} were expected"
    first = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
    return f"{len(got)} bytes of the right length, differing from byte {first} on"
