"""The stored block format: round trips, and every kind of damage is caught."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import Namespace
from kvtier.block import framing
from kvtier.block.framing import (
    ALIGN,
    ALIGN_MIN,
    MAGIC,
    Codec,
    Frame,
    decode_into,
    encode,
    encode_parts,
    header_size,
    parse_header,
    recode,
)
from kvtier.block.namespace import FORMAT_VERSION
from kvtier.spec import CorruptBlockError

NS = Namespace("model-a", dtype="bfloat16", tokens_per_block=32).fingerprint
OTHER_NS = Namespace("model-b", dtype="bfloat16", tokens_per_block=32).fingerprint
KEY = bytes(range(32))

CODECS = [Codec(), Codec("zstd", 1, 0), Codec("zstd", 3, 2), Codec("zstd", 1, 4)]


def bf16_like(n: int, seed: int = 0) -> bytes:
    """Random-normal values truncated to bf16: what KV cache looks like."""
    values = np.random.default_rng(seed).standard_normal(n // 2).astype(np.float32)
    return (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()


@pytest.fixture(autouse=True, scope="module", params=["one-pass", "two-passes"])
def copy_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test twice: uncompressed payloads copied and checked in one pass
    (the C extension) and in two (the Python the format falls back on)."""
    if request.param == "one-pass" and not framing.checks_while_copying():
        pytest.skip("kvtier.block._xxh3copy is not built")
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "two-passes":
            patch.setattr(framing, "_xxh3copy", None)
        yield request.param


def decode(blob: bytes, size: int, ns: bytes = NS, key: bytes = KEY) -> bytes:
    out = bytearray(size)
    decode_into(blob, ns, key, memoryview(out))
    return bytes(out)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: f"{c.name}-{c.level}-s{c.shuffle}")
@pytest.mark.parametrize("size", [0, 1, 3, 4097, 1 << 20])
def test_round_trip(codec: Codec, size: int) -> None:
    payload = bf16_like(size - size % 2, seed=size) + os.urandom(size % 2)
    blob = encode(NS, KEY, payload, codec)
    assert blob.startswith(MAGIC)
    assert decode(blob, len(payload)) == payload


@given(
    payload=st.binary(max_size=5000),
    key=st.binary(min_size=1, max_size=64),
    codec=st.sampled_from(CODECS),
)
@settings(max_examples=150, deadline=None)
def test_round_trip_any_bytes(payload: bytes, key: bytes, codec: Codec) -> None:
    blob = encode(NS, key, payload, codec)
    assert decode(blob, len(payload), key=key) == payload


def test_uncompressed_header_size_is_predictable() -> None:
    payload = os.urandom(12345)
    header, stored = encode_parts(NS, KEY, payload, Codec())
    assert len(header) == header_size(NS, KEY, len(payload))
    assert bytes(stored) == payload  # passed through, not copied into the header


@given(key=st.binary(min_size=1, max_size=64),
       size=st.sampled_from([0, 1, 127, 128, 255, 256, ALIGN_MIN - 1, ALIGN_MIN,
                             65535, 65536, (1 << 32) - 1, 1 << 32]))
@settings(max_examples=150, deadline=None)
def test_header_size_is_the_size_of_the_header_made(key: bytes, size: int) -> None:
    # header_size is computed from lengths alone (and cached per length)
    header = framing._header_bytes(NS, key, size, framing.CODEC_NONE,
                                   xxhash.xxh3_64_digest(key), size, 0)
    assert header_size(NS, key, size) == len(header)


@pytest.mark.parametrize("size", [ALIGN_MIN - 1, ALIGN_MIN, (2 << 20) + 3])
def test_large_uncompressed_payloads_start_aligned(size: int) -> None:
    payload = os.urandom(size)
    header, _ = encode_parts(NS, KEY, payload, Codec())
    assert len(header) == header_size(NS, KEY, size)
    blob = encode(NS, KEY, payload, Codec())
    start = parse_header(blob, NS, KEY).size
    assert start == len(header)
    if size >= ALIGN_MIN:
        assert start == ALIGN and blob[start:] == payload
    else:
        assert start < 200
    assert decode(blob, size) == payload
    # a compressed payload has no fixed place to align to: no padding
    packed = encode(NS, KEY, payload, Codec("zstd", 1, 0))
    assert parse_header(packed, NS, KEY).size < 200


def test_header_padding_must_be_zero_and_whole() -> None:
    payload = os.urandom(ALIGN_MIN)
    blob = encode(NS, KEY, payload, Codec())
    for offset in (100, ALIGN // 2, ALIGN - 1):  # inside the padding
        damaged = bytearray(blob)
        damaged[offset] = 1
        with pytest.raises(CorruptBlockError, match="padding"):
            decode(bytes(damaged), len(payload))
    with pytest.raises(CorruptBlockError, match="padding"):
        parse_header(blob[: ALIGN - 1], NS, KEY)  # a header cut short
    assert parse_header(blob[:ALIGN], NS, KEY).size == ALIGN


def test_shuffle_makes_bf16_smaller() -> None:
    payload = bf16_like(1 << 20)
    plain = encode(NS, KEY, payload, Codec("zstd", 1, 0))
    shuffled = encode(NS, KEY, payload, Codec("zstd", 1, 2))
    assert len(shuffled) < len(plain) < len(payload)


def test_foreign_namespace_and_key_are_rejected() -> None:
    blob = encode(NS, KEY, b"kv" * 100, Codec())
    with pytest.raises(CorruptBlockError, match="namespace"):
        decode(blob, 200, ns=OTHER_NS)
    with pytest.raises(CorruptBlockError, match="key"):
        decode(blob, 200, key=b"another key")


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: f"{c.name}-s{c.shuffle}")
def test_every_flipped_payload_byte_is_caught(codec: Codec) -> None:
    payload = bf16_like(4096)
    blob = bytearray(encode(NS, KEY, payload, codec))
    start = parse_header(blob, NS, KEY).size
    for offset in range(start, len(blob), max(1, (len(blob) - start) // 97)):
        damaged = bytearray(blob)
        damaged[offset] ^= 0x01
        with pytest.raises(CorruptBlockError):
            decode(bytes(damaged), len(payload))


def test_every_flipped_header_byte_is_caught_or_harmless() -> None:
    payload = os.urandom(256)
    blob = encode(NS, KEY, payload, Codec())
    size = parse_header(blob, NS, KEY).size
    for offset in range(size):
        damaged = bytearray(blob)
        damaged[offset] ^= 0x40
        try:
            got = decode(bytes(damaged), len(payload))
        except CorruptBlockError:
            continue
        assert got == payload  # a flip that decodes must not change the data


@pytest.mark.parametrize("cut", [0, 3, 6, 20, -1, -100])
def test_truncated_blocks_are_caught(cut: int) -> None:
    payload = os.urandom(1000)
    blob = encode(NS, KEY, payload, Codec("zstd", 1, 0))
    with pytest.raises(CorruptBlockError):
        decode(blob[:cut], len(payload))


def test_extended_block_is_caught() -> None:
    payload = os.urandom(1000)
    blob = encode(NS, KEY, payload, Codec())
    with pytest.raises(CorruptBlockError, match="payload is 1001"):
        decode(blob + b"x", len(payload))


def test_reader_expecting_another_size_gets_an_error() -> None:
    blob = encode(NS, KEY, os.urandom(100), Codec())
    with pytest.raises(CorruptBlockError, match="expects 64"):
        decode(blob, 64)


def _forge(fields: list[object], payload: bytes) -> bytes:
    body = msgpack.packb(fields, use_bin_type=True)
    return struct.pack("<4sH", MAGIC, len(body)) + body + payload


def test_zstd_bomb_claiming_a_small_size_is_rejected() -> None:
    import zstandard

    bomb = zstandard.ZstdCompressor().compress(bytes(50 << 20))
    checksum = xxhash.xxh3_64_digest(bomb)
    blob = _forge([FORMAT_VERSION, NS, KEY, len(bomb), 1, checksum, 100, 0, b"", b"", b""], bomb)
    with pytest.raises(CorruptBlockError, match="frame size"):
        decode(blob, 100)


@pytest.mark.parametrize(
    "fields",
    [
        [2, NS, KEY, 4, 0, b"\0" * 8, 4, 0],  # future version
        [1, NS, KEY, 4, 9, b"\0" * 8, 4, 0],  # unknown codec
        [1, NS, KEY, 4, 0, b"\0" * 7, 4, 0],  # short checksum
        [1, NS, KEY, -4, 0, b"\0" * 8, 4, 0],  # negative length
        [1, NS, KEY, "4", 0, b"\0" * 8, 4, 0],  # wrong type
        [1, NS, KEY, 4, 0, b"\0" * 8, 5, 0],  # lengths disagree without a codec
        [1, NS, KEY, 4, 0, b"\0" * 8, 4],  # missing field
        {"v": 1},  # not an array
    ],
)
def test_forged_headers_are_rejected(fields: list[object]) -> None:
    with pytest.raises(CorruptBlockError):
        decode(_forge(fields, b"abcd"), 4)


def test_garbage_is_rejected() -> None:
    for blob in (b"", b"KVTB", os.urandom(100), MAGIC + b"\xff\xff" + os.urandom(10)):
        with pytest.raises(CorruptBlockError):
            decode(blob, 10)


def test_recode_changes_codec_and_keeps_data() -> None:
    payload = bf16_like(8192)
    plain = encode(NS, KEY, payload, Codec())
    packed = recode(plain, NS, KEY, Codec("zstd", 1, 2), verify=True)
    assert len(packed) < len(plain)
    assert decode(packed, len(payload)) == payload
    assert recode(plain, NS, KEY, Codec(), verify=True) is plain  # same codec: no copy


def test_namespace_fingerprint_covers_every_field() -> None:
    base = Namespace("m", "bf16", 32, "nhd", "tp1")
    variants = [
        Namespace("m2", "bf16", 32, "nhd", "tp1"),
        Namespace("m", "fp16", 32, "nhd", "tp1"),
        Namespace("m", "bf16", 16, "nhd", "tp1"),
        Namespace("m", "bf16", 32, "hnd", "tp1"),
        Namespace("m", "bf16", 32, "nhd", "tp2-rank0"),
        Namespace("m", "bf16", 32, "nhd", "tp1", {"kv_quant": "fp8"}),
    ]
    prints = {v.fingerprint for v in variants}
    assert base.fingerprint not in prints and len(prints) == len(variants)
    assert Namespace.of("m").hex == Namespace("m").hex and len(base.hex) == 32
    assert (
        Namespace.of(
            {
                "model": "m",
                "dtype": "bf16",
                "tokens_per_block": 32,
                "kv_layout": "nhd",
                "parallel_layout": "tp1",
            }
        )
        == base
    )
    with pytest.raises(ValueError, match="unknown namespace field"):
        Namespace.of({"model": "m", "colour": "blue"})


@pytest.mark.parametrize("size", [0, 5, ALIGN_MIN, 1 << 20])
def test_a_frame_is_the_block_encode_makes(size: int) -> None:
    payload = os.urandom(size)
    frame = Frame(NS, KEY, payload)
    block = encode(NS, KEY, payload, Codec())
    assert frame.nbytes == len(block)
    assert b"".join(frame) == block
    header, stored = frame
    assert (header, bytes(stored)) == (frame[-2], bytes(frame[-1]))
    assert [bytes(p) for p in frame[1:]] == [payload]
    with pytest.raises(IndexError):
        frame[2]


def test_a_frame_checksums_its_payload_when_its_header_is_first_read() -> None:
    # what lets a store that writes block by block checksum each block just
    # before it goes out; the caller keeps the payload unchanged meanwhile anyway
    payload = bytearray(os.urandom(4096))
    frame = Frame(NS, KEY, payload)
    payload[0] ^= 0xFF
    assert decode(b"".join(frame), len(payload)) == bytes(payload)


def test_decoding_checks_while_copying_in_one_pass_mode_only(copy_mode: str) -> None:
    assert framing.checks_while_copying() == (copy_mode == "one-pass")


@pytest.mark.parametrize("size", [240, 241, 4097, ALIGN_MIN + 1])
def test_a_damaged_payload_is_caught_when_verifying_and_copied_when_not(size: int) -> None:
    payload = os.urandom(size)
    damaged = bytearray(encode(NS, KEY, payload, Codec()))
    damaged[-1 - size // 3] ^= 0x10
    out = bytearray(size)
    with pytest.raises(CorruptBlockError, match="checksum mismatch"):
        decode_into(damaged, NS, KEY, memoryview(out))
    decode_into(damaged, NS, KEY, memoryview(out), verify=False)
    assert out == damaged[-size:]  # unverified, the stored bytes as they are


@pytest.mark.parametrize("codec", CODECS, ids=str)
@pytest.mark.parametrize("size", [0, 7, 4097, ALIGN_MIN + 3])
def test_decode_gives_the_payload_as_new_bytes_with_the_header_it_parsed(
    codec: Codec, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = bf16_like(size - size % 2) + os.urandom(size % 2)
    blob = encode(NS, KEY, payload, codec)
    parsed = []
    real = framing.parse_header
    monkeypatch.setattr(framing, "parse_header", lambda *a: parsed.append(a) or real(*a))
    decoded, header = framing.decode(blob, NS, KEY)
    assert type(decoded) is bytes and decoded == payload
    assert len(parsed) == 1 and header == real(blob, NS, KEY)
    # a caller holding the header already parses nothing
    assert framing.decode(blob, NS, KEY, header=header).payload == payload and len(parsed) == 1


def test_decode_checks_what_it_decodes_unless_told_not_to() -> None:
    payload = os.urandom(5000)
    damaged = bytearray(encode(NS, KEY, payload, Codec()))
    damaged[-1] ^= 0x01
    with pytest.raises(CorruptBlockError, match="checksum mismatch"):
        framing.decode(damaged, NS, KEY)
    assert framing.decode(damaged, NS, KEY, verify=False).payload == bytes(damaged[-5000:])
    with pytest.raises(CorruptBlockError):
        framing.decode(encode(NS, KEY, payload, Codec()), NS, b"another key")


@pytest.mark.parametrize("to", [Codec("zstd", 1, 2), Codec("zstd", 1, 4), Codec()], ids=str)
def test_recode_never_gives_unchecked_bytes_a_new_checksum(to: Codec) -> None:
    """A frame in another form is re-encoded, with a checksum taken afresh: that
    checksum must not vouch for a payload nobody checked, so recode checks it
    first even when told not to verify (a frame it keeps as it is, it does not)."""
    source = Codec("zstd", 1, 2) if to.name == "none" else Codec()
    damaged = bytearray(encode(NS, KEY, bf16_like(8192), source))
    damaged[-2] ^= 0x04
    with pytest.raises(CorruptBlockError):
        recode(bytes(damaged), NS, KEY, to, verify=False)
    kept = recode(bytes(damaged), NS, KEY, source, verify=False)
    assert kept == damaged  # as it came, its own checksum still in it
    with pytest.raises(CorruptBlockError):
        decode(kept, 8192)


def test_kept_as_compares_the_stored_form_not_the_level() -> None:
    plain = parse_header(encode(NS, KEY, bytes(4096), Codec()), NS, KEY)
    packed = parse_header(encode(NS, KEY, bytes(4096), Codec("zstd", 3, 2)), NS, KEY)
    assert framing.kept_as(plain, Codec()) and framing.kept_as(plain, Codec("none", 5, 0))
    assert framing.kept_as(packed, Codec("zstd", 9, 2))
    assert not framing.kept_as(packed, Codec("zstd", 3, 4))
    assert not framing.kept_as(plain, Codec("zstd"))
