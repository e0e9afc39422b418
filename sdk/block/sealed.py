"""Sealed blocks: the frames of a tier with ``encrypt``, sealed and opened where
the I/O happens.

The cipher is :mod:`~kvtier.block.crypt`'s; this module is where it meets
the block format (:mod:`~kvtier.block.header`).  AES-GCM of the
``cryptography`` package lets go of the GIL, so the work is placed where
it runs beside the disk rather than before or after it:

* a put seals each block when a backend first reads its payload
  (:class:`~kvtier.block.framing.SealedFrame`), in the I/O thread that then
  writes it, while the other threads' blocks go to the disk;
* a read scatters a block's ciphertext into a page-aligned scratch buffer
  and its tag beside the header (:func:`scatter_sealed`); a backend that
  reads in worker threads calls the list's ``landed`` once the block is in
  (:func:`kvtier.block.buffers.landed`), and the block is opened there, from
  the scratch buffer into the caller's, in one pass.  Where no backend
  did, :func:`open_scattered` opens it in the calling thread.

The scratch buffer, not the caller's, takes the ciphertext: AES-GCM writes
the plaintext while it reads the ciphertext, so a read into the caller's
buffer would need a second pass over it (the plaintext through a bounce
buffer and back), where this needs none.  Both take the disk's DMA the
same way, O_DIRECT included: the scratch buffer is page-aligned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kvtier.block.crypt import TAG_LEN, Keyring, take_aligned
from kvtier.block.header import (
    CODEC_NONE,
    Codec,
    Header,
    _header_bytes,
    header_size,
    parse_header,
)
from kvtier.spec import BytesLike, CorruptBlockError

__all__ = [
    "SealedHead",
    "SealedScatter",
    "open_scattered",
    "open_sealed",
    "scatter_sealed",
    "sealed_header",
]


def sealed_header(namespace: bytes, key: bytes, stored_len: int, raw_len: int, shuffle: int,
                  codec: Codec, nonce: bytes) -> bytes:
    """The header of a block sealed by a tier of ``codec`` under ``nonce``: the cipher's
    associated data.  ``stored_len``: the codec's output, before the tag."""
    assert codec.seal is not None
    return _header_bytes(namespace, key, stored_len + TAG_LEN, codec.codec_id, b"", raw_len,
                         shuffle, codec.tenant, codec.seal.write_id, nonce)


def open_sealed(header: Header, stored: BytesLike, seal: Keyring | None,
                out: memoryview | None = None) -> memoryview:
    """A sealed payload opened into ``out`` (else new memory): the codec's output.

    A wrong tag, or a tier without keys, is a :class:`~kvtier.spec.CorruptBlockError`.
    """
    if seal is None:
        raise CorruptBlockError("sealed block, and this tier has no keys (encrypt is not set)")
    if out is None:
        out = np.empty(header.stored_len - TAG_LEN, dtype=np.uint8).data
    seal.open_into(header.key_id, header.tenant, header.nonce, stored, header.aad, out)
    return out


class SealedHead(bytearray):
    """The header's buffer of a sealed block's scatter list, and the tag after it.

    It also keeps the block's scratch buffer (ciphertext, then the tag
    copied after it), and what opening it in an I/O thread found: the
    header it opened (its associated data), and the error if it failed.
    """

    scratch: memoryview | None = None
    opened: bytes | None = None
    failure: str | None = None


class SealedScatter(list[Any]):
    """A sealed block's scatter list ``[header, ciphertext, tag]``, which opens the
    block into the caller's buffer when told it :meth:`landed`."""

    def __init__(self, parts: Sequence[memoryview], head: SealedHead, namespace: bytes,
                 key: bytes, out: memoryview, seal: Keyring) -> None:
        super().__init__(parts)
        self._head, self._namespace, self._key = head, namespace, key
        self._out, self._seal = out, seal

    def landed(self) -> None:
        """The whole block was read into this list: open it, in the reader's thread.

        Only a block laid out as this list expects is opened (anything else
        is left to the tier, which reads it whole); the outcome is kept on
        the head, bound to the header it was found with, for
        :func:`open_scattered`.  Never raises for the block's contents.
        """
        head, out = self._head, self._out
        try:
            header = parse_header(head, self._namespace, self._key)
        except CorruptBlockError:
            return
        if not (header.key_id and header.codec == CODEC_NONE and header.raw_len == out.nbytes
                and header.size + TAG_LEN == len(head)):
            return
        try:
            _open_scratch(header, head, out, self._seal)
        except CorruptBlockError as exc:
            head.failure = str(exc)
        head.opened = header.aad


def scatter_sealed(namespace: bytes, key: bytes, out: memoryview,
                   codec: Codec) -> tuple[SealedHead, SealedScatter]:
    """A scatter list for an uncompressed block a tier of ``codec`` sealed, of
    ``out.nbytes`` bytes: ``(head, [header, ciphertext, tag])``.  ``head``
    holds the header, then the tag; the ciphertext goes to a page-aligned
    scratch buffer, the plaintext to ``out`` once it is opened."""
    assert codec.seal is not None
    size = header_size(namespace, key, out.nbytes, codec)
    head = SealedHead(size + TAG_LEN)
    scratch = head.scratch = take_aligned(out.nbytes + TAG_LEN)
    view = memoryview(head)
    parts = [view[:size], scratch[: out.nbytes], view[size:]]
    return head, SealedScatter(parts, head, namespace, key, out, codec.seal)


def _open_scratch(header: Header, head: SealedHead, out: memoryview, seal: Keyring) -> None:
    scratch = head.scratch
    if scratch is None:
        raise CorruptBlockError("sealed block read without its scratch buffer")
    n = out.nbytes
    scratch[n : n + TAG_LEN] = memoryview(head)[header.size : header.size + TAG_LEN]
    seal.open_into(header.key_id, header.tenant, header.nonce, scratch[: n + TAG_LEN],
                   header.aad, out)


def open_scattered(header: Header, head: bytearray, out: memoryview,
                   seal: Keyring | None) -> None:
    """Open a sealed block that :func:`scatter_sealed`'s list read (whose layout the
    caller compared) into ``out``: where the backend's I/O thread opened it
    already, answer what that found, else open it here."""
    if seal is None:
        raise CorruptBlockError("sealed block, and this tier has no keys (encrypt is not set)")
    if not isinstance(head, SealedHead) or header.size + TAG_LEN != len(head):
        raise CorruptBlockError("sealed block read into a plaintext tier's scatter list")
    try:
        if head.opened is not None and head.opened == header.aad:
            if head.failure is not None:
                raise CorruptBlockError(head.failure)
            return
        _open_scratch(header, head, out, seal)
    finally:
        head.scratch = None  # back to the pool once the list is gone
