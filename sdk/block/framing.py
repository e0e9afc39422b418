"""The self-describing block format every tier stores.

Layout of a stored block::

    b"KVTB" | header length (u16, little endian) | msgpack header | payload

The header is a msgpack array, in this order:

==========  ==========================================================
version     :data:`~kvtier.block.namespace.FORMAT_VERSION`
namespace   16-byte namespace fingerprint
key         the block's key (1-64 bytes)
stored_len  length of the payload as stored (after the codec)
codec       0 = none, 1 = zstd
checksum    xxh3-64 of the stored payload, seeded with ``shuffle``, 8 bytes big-endian;
            empty in a sealed block, whose GCM tag stands in for it
raw_len     length of the payload before the codec
shuffle     byte-shuffle element size applied before the codec, 0 = none
tenant      the tenant whose block it is (0-64 bytes)
key_id      8 bytes naming the master key a sealed block is encrypted under; empty: plaintext
nonce       a sealed block's random 96-bit AES-GCM nonce; empty: plaintext
==========  ==========================================================

A sealed block (a tier with ``encrypt``, :mod:`kvtier.block.crypt`) stores
the codec's output encrypted with AES-256-GCM, its 16-byte tag appended
(``stored_len`` counts it); the whole header, padding included, is the
associated data, so no field of it can change without the block failing.

An uncompressed payload of :data:`ALIGN_MIN` bytes or more starts at a
:data:`ALIGN` boundary of the block: zero bytes pad the header up to it (they
must be zero to decode).  A block stored as a file then has its payload at an
aligned file offset, and a reader using ``O_DIRECT`` lands it straight in
page-aligned memory, such as an engine's KV rows, without a copy.

Decoding checks every field against what the reader expects; any mismatch is
a :class:`CorruptBlockError`, which tiers turn into a miss and a counter.
The checksum covers the payload, and through its seed the shuffle width,
the one header field that changes decoded bytes without being cross-checked
(``raw_len`` is checked against the zstd frame, ``codec`` against the lengths).
Decoding never executes anything: msgpack with explicit size limits, plain
ints and bytes only.

The header's bytes and their checks are :mod:`~kvtier.block.header`; how a
sealed block is made and opened beside the I/O is :mod:`~kvtier.block.sealed`.
This module puts them together, and its names are the ones to use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple, overload

import numpy as np
import xxhash

from kvtier.block.compress import compressor, decompress, shuffle_bytes, unpack_into, unshuffle
from kvtier.block.crypt import TAG_LEN, Keyring
from kvtier.block.header import (
    _UNCOMPRESSED,
    ALIGN,
    ALIGN_MIN,
    CODEC_NONE,
    CODEC_ZSTD,
    CODECS,
    MAGIC,
    SHUFFLE_WIDTHS,
    ZSTD_LEVELS,
    Codec,
    Header,
    _header_bytes,
    header_size,
    parse_header,
)
from kvtier.block.sealed import (
    open_scattered,
    scatter_sealed,
    sealed_header,
)
from kvtier.block.sealed import (
    open_sealed as _open,
)
from kvtier.spec import BytesLike, CorruptBlockError

try:
    from kvtier.block import _xxh3copy
except ImportError:  # built without a C compiler: copy, then checksum
    _xxh3copy = None  # type: ignore[assignment]

__all__ = [
    "ALIGN",
    "ALIGN_MIN",
    "CODECS",
    "CODEC_NONE",
    "CODEC_ZSTD",
    "MAGIC",
    "SHUFFLE_WIDTHS",
    "ZSTD_LEVELS",
    "Checked",
    "Codec",
    "Decoded",
    "Frame",
    "Header",
    "SealedFrame",
    "check_payload",
    "check_scattered",
    "checks_while_copying",
    "copy_digest",
    "decode",
    "decode_into",
    "digest",
    "encode",
    "encode_parts",
    "header_size",
    "kept_as",
    "lazy_frame",
    "parse_header",
    "recode",
    "scatter_for",
    "trailer",
]

class Decoded(NamedTuple):
    """What :func:`decode` gives: the raw payload as new ``bytes``, and the header it parsed."""

    payload: bytes
    header: Header


class Checked(NamedTuple):
    """A frame as a tier read it, its header parsed and checked.

    ``parts`` join into the frame: ``(frame,)``, or ``(header bytes, payload)``
    where the payload was read straight into a caller's buffer.  ``verified``:
    the payload was checked against the header's checksum.  An unverified
    frame keeps the checksum it was read with, so whoever reads it later with
    verification still checks it.
    """

    parts: tuple[BytesLike, ...]
    header: Header
    verified: bool


def scatter_for(
    namespace: bytes, key: bytes, out: memoryview, codec: Codec
) -> tuple[bytearray, list[memoryview]]:
    """A scatter list that reads an uncompressed block of ``codec`` into ``out``.

    Returns ``(head, [header, out])``: ``head`` holds the header.  A sealed
    block's list is :func:`~kvtier.block.sealed.scatter_sealed`'s, whose head
    holds the tag after the header.  :func:`check_scattered` checks what the
    list read.
    """
    if codec.seal is not None:
        return scatter_sealed(namespace, key, out, codec)
    head = bytearray(header_size(namespace, key, out.nbytes, codec))
    return head, [memoryview(head), out]


def trailer(header: Header) -> int:
    """Bytes of a block after its payload's place in a scatter read: a sealed block's tag."""
    return TAG_LEN if header.key_id else 0


def check_scattered(
    header: Header, head: bytearray, out: memoryview, verify: bool, seal: Keyring | None
) -> None:
    """Check an uncompressed block read by :func:`scatter_for`'s list, whose layout
    the caller compared: a plaintext payload's checksum when ``verify``, or a
    sealed one opened into ``out`` (its tag always checked)."""
    if header.key_id:
        open_scattered(header, head, out, seal)
    else:
        check_payload(header, out, verify)


def encode_parts(
    namespace: bytes, key: bytes, payload: BytesLike, codec: Codec
) -> tuple[bytes, BytesLike]:
    """Encode one block as ``(header, stored_payload)``, a gather list.

    With codec ``none`` the payload is passed through uncopied: the caller
    decides whether to join the parts or write them with a gather call.
    """
    view = memoryview(payload).cast("B")
    raw_len = view.nbytes
    shuffle = 0
    stored: BytesLike = view
    if codec.name == "zstd":
        if codec.shuffle > 1 and raw_len >= codec.shuffle:
            stored = shuffle_bytes(view, codec.shuffle)
            shuffle = codec.shuffle
        stored = compressor(codec.level).compress(stored)
    seal = codec.seal
    if seal is not None:  # the GCM tag stands in for the checksum: one pass over the payload
        nonce = seal.nonce()
        header = sealed_header(namespace, key, memoryview(stored).nbytes, raw_len, shuffle,
                               codec, nonce)
        return header, seal.seal(codec.tenant, nonce, stored, header)
    checksum = _checksum(stored, shuffle)
    header = _header_bytes(namespace, key, len(stored), codec.codec_id, checksum, raw_len, shuffle,
                           codec.tenant)
    return header, stored


class Frame(Sequence[BytesLike]):
    """An uncompressed block as the gather list ``(header, payload)``, checksummed late.

    What a tier hands ``kvtier_put_parts`` for codec ``none``.  Its size,
    :attr:`nbytes`, is known at once; the header, and with it the checksum
    pass over the payload, is made when the header is first read.  A store
    that writes a batch block by block (the peer client's ``sendmsg``) thus
    checksums each block just before it goes out, while the other end still
    takes in the one before, rather than every block before the first byte
    leaves.  A store that copies each block in (host) copies it while the
    checksum pass has left it in the CPU cache.  Both gained (BENCHMARKS.md,
    "Figures behind design choices").  The payload must stay unchanged until
    the header is made, as it must until the put returns.
    Two threads reading the header first at once both make the same bytes.
    """

    __slots__ = ("_codec", "_header", "_key", "_namespace", "_payload", "nbytes")

    def __init__(self, namespace: bytes, key: bytes, payload: BytesLike,
                 codec: Codec = _UNCOMPRESSED) -> None:
        if codec.name != "none" or codec.seal is not None:
            raise ValueError("a Frame is a plaintext, uncompressed block")
        self._namespace, self._key, self._codec = namespace, key, codec
        self._payload = memoryview(payload).cast("B")
        self._header: bytes | None = None
        #: Bytes in the block, header included.
        size = self._payload.nbytes
        self.nbytes = header_size(namespace, key, size, codec) + size

    @property
    def header(self) -> bytes:
        header = self._header
        if header is None:
            header = encode_parts(self._namespace, self._key, self._payload, self._codec)[0]
            self._header = header
        return header

    def __len__(self) -> int:
        return 2

    @overload
    def __getitem__(self, index: int) -> BytesLike: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[BytesLike]: ...
    def __getitem__(self, index: int | slice) -> BytesLike | Sequence[BytesLike]:
        if isinstance(index, slice):
            return [self[i] for i in range(2)[index]]
        if index in (0, -2):
            return self.header
        if index in (1, -1):
            return self._payload
        raise IndexError("a frame has two parts, header and payload")


class SealedFrame(Frame):
    """An uncompressed block of a tier that seals, as the gather list ``(header,
    ciphertext, tag)``, sealed late.

    Its header, with a fresh nonce, and its size are made at once; the
    payload is sealed when its ciphertext or tag is first read.  A backend
    writing a batch in I/O threads (fs) thus seals each block in the thread
    that writes it, beside the other threads' writes, rather than every
    block in the calling thread before the first write (BENCHMARKS.md,
    "Encryption at rest").  Ciphertext and tag are apart, so that an
    O_DIRECT write takes the page-aligned ciphertext as it is.  As for a
    :class:`Frame`, the payload must stay unchanged until the put returns;
    two threads sealing it first at once both make the same bytes (one nonce).
    """

    __slots__ = ("_nonce", "_sealed")

    def __init__(self, namespace: bytes, key: bytes, payload: BytesLike, codec: Codec) -> None:
        if codec.name != "none" or codec.seal is None:
            raise ValueError("a SealedFrame is an uncompressed block of a tier that seals")
        self._namespace, self._key, self._codec = namespace, key, codec
        self._payload = memoryview(payload).cast("B")
        size = self._payload.nbytes
        self._nonce = codec.seal.nonce()
        self._header = sealed_header(namespace, key, size, size, 0, codec, self._nonce)
        self._sealed: memoryview | None = None
        self.nbytes = len(self._header) + size + TAG_LEN

    @property
    def sealed(self) -> memoryview:
        """The payload sealed: ciphertext, then tag."""
        sealed = self._sealed
        if sealed is None:
            seal = self._codec.seal
            assert seal is not None
            sealed = seal.seal(self._codec.tenant, self._nonce, self._payload, self.header)
            self._sealed = sealed
        return sealed

    def __len__(self) -> int:
        return 3

    @overload
    def __getitem__(self, index: int) -> BytesLike: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[BytesLike]: ...
    def __getitem__(self, index: int | slice) -> BytesLike | Sequence[BytesLike]:
        if isinstance(index, slice):
            return [self[i] for i in range(3)[index]]
        if not -3 <= index < 3:
            raise IndexError("a sealed frame has three parts, header, ciphertext and tag")
        index %= 3
        if index == 0:
            return self.header
        size = self._payload.nbytes
        return self.sealed[:size] if index == 1 else self.sealed[size:]


def lazy_frame(namespace: bytes, key: bytes, payload: BytesLike, codec: Codec) -> Frame:
    """An uncompressed block of a tier of ``codec`` as a gather list whose costly
    pass over the payload is made when a backend first reads it: a
    :class:`SealedFrame` for a tier that seals, else a :class:`Frame`."""
    if codec.seal is not None:
        return SealedFrame(namespace, key, payload, codec)
    return Frame(namespace, key, payload, codec)


def _checksum(stored: BytesLike, shuffle: int) -> bytes:
    # the seed binds the shuffle width: a flipped width would pass the payload
    # check and hand out scrambled bytes
    digest: bytes = xxhash.xxh3_64_digest(stored, seed=shuffle)
    return digest


def encode(namespace: bytes, key: bytes, payload: BytesLike, codec: Codec) -> bytes:
    """Encode one block as a single ``bytes`` object (one copy of the payload)."""
    header, stored = encode_parts(namespace, key, payload, codec)
    return b"".join((header, stored))


def check_payload(
    header: Header, stored: BytesLike, verify: bool, seal: Keyring | None = None
) -> None:
    """Check the stored payload's length, and its checksum when ``verify``.

    A sealed payload's check is its GCM tag: it is opened (into scratch
    memory) with ``seal``; without one it cannot be checked, and is corrupt.
    """
    if memoryview(stored).nbytes != header.stored_len:
        raise CorruptBlockError(
            f"payload is {memoryview(stored).nbytes} bytes, header says {header.stored_len}"
        )
    if not verify:
        return
    if header.key_id:
        _open(header, stored, seal)
    elif _checksum(stored, header.shuffle) != header.checksum:
        raise CorruptBlockError("checksum mismatch")


def digest(data: BytesLike) -> int:
    """The xxh3-64 of ``data`` (unseeded), as :func:`copy_digest` answers it."""
    value: int = xxhash.xxh3_64_intdigest(data)
    return value


def copy_digest(src: memoryview) -> tuple[memoryview, int]:
    """A copy of ``src`` and the xxh3-64 of the bytes copied (what the copy holds).

    In one pass where the C extension is built, else copy, then hash the
    copy.  The copy's memory is left uninitialised (``numpy.empty``), so the
    copy is the one pass over it: a ``bytearray`` would zero it first.
    """
    dst = np.empty(src.nbytes, dtype=np.uint8).data
    if _xxh3copy is not None and src.nbytes >= _xxh3copy.MIN_LEN:
        return dst, _xxh3copy.copy_xxh3_64(src, dst, 0)
    dst[:] = src
    return dst, digest(dst)


def checks_while_copying() -> bool:
    """Whether :func:`decode_into` takes an uncompressed payload's checksum as it
    copies it (one pass, in C) rather than before (two passes)."""
    return _xxh3copy is not None


def decode_into(
    blob: BytesLike,
    namespace: bytes,
    key: bytes,
    out: memoryview,
    *,
    verify: bool = True,
    header: Header | None = None,
    seal: Keyring | None = None,
) -> Header:
    """Check ``blob`` fully and write its raw payload into ``out``.

    ``header`` is the block's, when the caller has parsed it already.
    ``seal`` opens a sealed block (whose tag is always checked).
    ``out`` must be exactly the raw payload size; a reader that cannot tell
    a sound block of another size from a damaged one compares
    ``header.raw_len`` first, as tiers do (:meth:`~kvtier.chain.tier.Tier.decode`).
    On error ``out`` may have been partly written.
    """
    if header is None:
        header = parse_header(blob, namespace, key)
    stored = memoryview(blob).cast("B")[header.size :]
    if header.key_id:
        check_payload(header, stored, False)
        if header.raw_len != out.nbytes:
            raise CorruptBlockError(
                f"block holds {header.raw_len} bytes, reader expects {out.nbytes}")
        if header.codec == CODEC_NONE:
            _open(header, stored, seal, out)
        else:
            unpack_into(_open(header, stored, seal), header.raw_len, header.shuffle, out)
        return header
    one_pass = (
        _xxh3copy is not None and header.codec == CODEC_NONE
        and stored.nbytes >= _xxh3copy.MIN_LEN and out.c_contiguous and not out.readonly
    )
    check_payload(header, stored, verify and not one_pass)
    if header.raw_len != out.nbytes:
        raise CorruptBlockError(f"block holds {header.raw_len} bytes, reader expects {out.nbytes}")
    if one_pass:
        # the copy and the checksum in one pass, in C; unverified too, as the
        # checksum rides free on the copy, which is faster than numpy's or a
        # memoryview's (BENCHMARKS.md, "Figures behind design choices")
        digest = _xxh3copy.copy_xxh3_64(stored, out, header.shuffle)
        if verify and digest.to_bytes(8, "big") != header.checksum:
            raise CorruptBlockError("checksum mismatch")
        return header
    if header.codec == CODEC_NONE:
        out[:] = stored
        return header
    unpack_into(stored, header.raw_len, header.shuffle, out)
    return header


def decode(
    blob: BytesLike,
    namespace: bytes,
    key: bytes,
    *,
    verify: bool = True,
    header: Header | None = None,
    seal: Keyring | None = None,
) -> Decoded:
    """Check ``blob`` fully and return its raw payload as new ``bytes``, with its header.

    For a reader that does not know the payload's size: the header is parsed
    once (not first to size a buffer, then again to decode into it), and the
    payload is copied once: sliced out, or decompressed, or unshuffled.
    """
    if header is None:
        header = parse_header(blob, namespace, key)
    stored = memoryview(blob).cast("B")[header.size :]
    check_payload(header, stored, verify and not header.key_id)
    if header.key_id:  # opened: its tag is checked whatever verify says
        stored = _open(header, stored, seal)
    if header.codec == CODEC_NONE:
        return Decoded(stored.tobytes(), header)
    raw = decompress(stored, header.raw_len)
    if header.shuffle:
        raw = unshuffle(raw, header.shuffle)
    return Decoded(raw, header)


def kept_as(header: Header, codec: Codec) -> bool:
    """Whether a tier encoding with ``codec`` stores the frame of ``header`` as it is.

    The level is not in a frame; a shuffle width is, and only zstd uses one.
    A tier that seals keeps only frames sealed under its writing key (one
    under an older key is sealed afresh), a plaintext tier only plaintext.
    """
    same_shuffle = codec.name == "none" or header.shuffle == codec.shuffle
    key_id = codec.seal.write_id if codec.seal is not None else b""
    return header.codec == codec.codec_id and same_shuffle and header.key_id == key_id


def recode(
    blob: BytesLike,
    namespace: bytes,
    key: bytes,
    codec: Codec,
    *,
    verify: bool,
    header: Header | None = None,
) -> bytes:
    """A checked frame for a tier with ``codec`` (promotion, demotion, a client's put).

    A frame the tier stores as it is (:func:`kept_as`) is checked when
    ``verify``, and returned uncopied if it is ``bytes``.  A frame in another
    form is always checked before it is re-encoded, whatever ``verify`` says:
    the new frame's checksum is taken afresh, and must never vouch for bytes
    that were not checked.  ``header``: the frame's, where the caller parsed it.
    A sealed frame is opened with ``codec``'s keys; the new frame keeps the
    tenant the frame names.
    """
    if header is None:
        header = parse_header(blob, namespace, key)
    stored = memoryview(blob).cast("B")[header.size :]
    if kept_as(header, codec):
        check_payload(header, stored, verify, codec.seal)
        return blob if isinstance(blob, bytes) else bytes(blob)
    payload = decode(blob, namespace, key, verify=True, header=header, seal=codec.seal).payload
    if header.tenant != codec.tenant:
        codec = dataclasses.replace(codec, tenant=header.tenant)
    return encode(namespace, key, payload, codec)
