"""Copy a payload and take its XXH3-64 in one pass (C, see _xxh3copy.c)."""

from kvtier.spec import BytesLike

#: Shortest input taken: the long-input form of XXH3 only.
MIN_LEN: int
#: The kernel chosen for this CPU at import: "avx2" or "portable".
KERNEL: str

def copy_xxh3_64(src: BytesLike, dst: BytesLike, seed: int = 0, /) -> int:
    """Copy ``src`` into ``dst`` (same length) and answer the XXH3-64 of the bytes."""

def xxh3_64(src: BytesLike, seed: int = 0, /) -> int:
    """The XXH3-64 of ``src``."""

def copy_xxh3_64_portable(src: BytesLike, dst: BytesLike, seed: int = 0, /) -> int:
    """:func:`copy_xxh3_64` with the portable kernel, whatever the CPU."""
