"""A block's header: the fields :mod:`~kvtier.block.framing` describes, as bytes
and back.

:func:`parse_header` checks every field of a header read back against what
the reader expects, and against each other; a mismatch is a
:class:`~kvtier.spec.CorruptBlockError`.  It never executes anything:
msgpack with explicit size limits, plain ints and bytes only.  The payload
is checked by :mod:`~kvtier.block.framing` (plaintext) and
:mod:`~kvtier.block.sealed` (encrypted).
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

import msgpack

from kvtier.block.compress import check_zstd_sizes
from kvtier.block.crypt import KEY_ID_LEN, NONCE_LEN, TAG_LEN, Keyring
from kvtier.block.namespace import FORMAT_VERSION
from kvtier.spec import BytesLike, CorruptBlockError

__all__ = [
    "ALIGN",
    "ALIGN_MIN",
    "CODECS",
    "CODEC_NONE",
    "CODEC_ZSTD",
    "MAGIC",
    "SHUFFLE_WIDTHS",
    "ZSTD_LEVELS",
    "Codec",
    "Header",
    "header_size",
    "parse_header",
]

MAGIC = b"KVTB"
_PREFIX = struct.Struct("<4sH")
_MAX_HEADER = 512
CODEC_NONE = 0
CODEC_ZSTD = 1
#: Codec names as a tier's ``codec`` takes them, and the id a header records.
CODECS = {"none": CODEC_NONE, "zstd": CODEC_ZSTD}
#: Element widths byte-shuffle groups by (16-, 32- and 64-bit values); a header
#: records 0 for none.  A tier's ``shuffle`` also takes 1, which like 0 turns
#: it off: bytes of one-byte elements are already grouped.
SHUFFLE_WIDTHS = (2, 4, 8)
#: The compression levels zstd accepts, fastest (negative) to smallest.
ZSTD_LEVELS = range(-7, 23)
#: Alignment of large uncompressed payloads within a block (a page, and the
#: logical block size of common disks).
ALIGN = 4096
#: Uncompressed payloads from this size on are aligned; below it the padding
#: would cost more than 1.6% of the block.
ALIGN_MIN = 256 << 10


@dataclass(frozen=True)
class Codec:
    """How a tier encodes payloads: ``zstd`` at ``level``, after byte-shuffle;
    sealed with ``seal``'s writing key where one is given.  ``tenant`` is the
    name new frames carry (a tier's namespace's tenant)."""

    name: str = "none"
    level: int = 1
    shuffle: int = 0
    tenant: bytes = b""
    seal: Keyring | None = None

    @property
    def codec_id(self) -> int:
        return CODECS[self.name]


_UNCOMPRESSED = Codec()


@dataclass(frozen=True)
class Header:
    namespace: bytes
    key: bytes
    stored_len: int
    codec: int
    checksum: bytes
    raw_len: int
    shuffle: int
    size: int  # bytes taken by magic, length and header before the payload
    tenant: bytes = b""
    key_id: bytes = b""  # empty: plaintext
    nonce: bytes = b""
    aad: bytes = b""  # a sealed block's header as stored: the cipher's associated data


def _header_bytes(
    namespace: bytes,
    key: bytes,
    stored_len: int,
    codec: int,
    checksum: bytes,
    raw_len: int,
    shuffle: int,
    tenant: bytes = b"",
    key_id: bytes = b"",
    nonce: bytes = b"",
) -> bytes:
    body: bytes = msgpack.packb(
        [FORMAT_VERSION, namespace, key, stored_len, codec, checksum, raw_len, shuffle,
         tenant, key_id, nonce],
        use_bin_type=True,
    )
    head = _PREFIX.pack(MAGIC, len(body)) + body
    if codec == CODEC_NONE and stored_len >= ALIGN_MIN:
        return head + bytes(-len(head) % ALIGN)
    return head


def header_size(namespace: bytes, key: bytes, payload_len: int, codec: Codec | None = None) -> int:
    """Bytes before the payload in an uncompressed block of ``payload_len``
    written by a tier of ``codec`` (its tenant, whether it seals).

    Lets a reader size a scatter list ``[header, payload]`` so an
    uncompressed block lands straight in the caller's buffer.
    """
    codec = codec or _UNCOMPRESSED
    return _header_len(len(namespace), len(key), payload_len, len(codec.tenant),
                       codec.seal is not None)


@functools.lru_cache(maxsize=1024)
def _header_len(namespace_len: int, key_len: int, payload_len: int, tenant_len: int = 0,
                sealed: bool = False) -> int:
    # msgpack's length of a bin depends on its length alone, so a batch of
    # one block size packs one header here, not one per block (1.3 us each)
    if sealed:
        return len(_header_bytes(bytes(namespace_len), bytes(key_len), payload_len + TAG_LEN,
                                 CODEC_NONE, b"", payload_len, 0, bytes(tenant_len),
                                 bytes(KEY_ID_LEN), bytes(NONCE_LEN)))
    return len(_header_bytes(bytes(namespace_len), bytes(key_len), payload_len, CODEC_NONE,
                             bytes(8), payload_len, 0, bytes(tenant_len)))


def parse_header(blob: BytesLike, namespace: bytes, key: bytes) -> Header:
    """Parse and check the header at the start of ``blob``.

    Checks magic, version, namespace and key; the payload's length and
    checksum are checked by :func:`decode_into`.
    """
    view = memoryview(blob).cast("B")
    if view.nbytes < _PREFIX.size:
        raise CorruptBlockError("block shorter than its prefix")
    magic, hlen = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise CorruptBlockError("bad magic")
    if hlen > _MAX_HEADER or view.nbytes < _PREFIX.size + hlen:
        raise CorruptBlockError("bad header length")
    try:
        fields = msgpack.unpackb(
            view[_PREFIX.size : _PREFIX.size + hlen],
            raw=True,
            use_list=True,
            strict_map_key=True,
            max_bin_len=128,
            max_str_len=0,
            max_array_len=16,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise CorruptBlockError(f"unreadable header: {exc}") from None
    if not isinstance(fields, list) or len(fields) != 11:
        raise CorruptBlockError("header is not an 11-field array")
    version, ns, hkey, stored_len, codec, checksum, raw_len, shuffle, tenant, key_id, nonce = fields
    if version != FORMAT_VERSION:
        raise CorruptBlockError(f"format version {version!r}, expected {FORMAT_VERSION}")
    if ns != namespace:
        raise CorruptBlockError("block belongs to another namespace")
    if hkey != key:
        raise CorruptBlockError("block belongs to another key")
    ints = (stored_len, codec, raw_len, shuffle)
    if not all(type(v) is int and v >= 0 for v in ints):
        raise CorruptBlockError("header fields have wrong types")
    if codec not in CODECS.values() or (shuffle and shuffle not in SHUFFLE_WIDTHS):
        raise CorruptBlockError(f"unknown codec {codec} or shuffle {shuffle}")
    if not all(isinstance(v, bytes) for v in (checksum, tenant, key_id, nonce)):
        raise CorruptBlockError("header fields have wrong types")
    sealed = bool(key_id)
    if sealed and (checksum or len(key_id) != KEY_ID_LEN or len(nonce) != NONCE_LEN):
        raise CorruptBlockError("bad key id, nonce or checksum field in a sealed block")
    if not sealed and (len(checksum) != 8 or nonce):
        raise CorruptBlockError("bad checksum field")
    tag = TAG_LEN if sealed else 0
    if stored_len < tag or len(tenant) > 64:
        raise CorruptBlockError("bad stored length or tenant")
    if codec == CODEC_NONE and (raw_len + tag != stored_len or shuffle):
        raise CorruptBlockError("uncompressed block with inconsistent lengths")
    size = _PREFIX.size + hlen
    if codec == CODEC_NONE and stored_len >= ALIGN_MIN:
        size += -size % ALIGN
        padding = view[_PREFIX.size + hlen : size].tobytes()
        if padding != bytes(size - _PREFIX.size - hlen):  # short, or not zero
            raise CorruptBlockError("header padding is short or not zero")
    if codec == CODEC_ZSTD:  # a sealed frame's size is checked once it is opened
        check_zstd_sizes(view[size:] if not sealed else view[:0], stored_len - tag, raw_len)
    aad = view[:size].tobytes() if sealed else b""
    return Header(ns, hkey, stored_len, codec, checksum, raw_len, shuffle, size, tenant, key_id,
                  nonce, aad)
