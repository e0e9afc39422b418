"""Bit rot: bytes flipped in stored blocks are always detected, served as misses, counted.

Blocks are corrupted where they rest: in the files of an ``fs`` tier (found
on disk by the key in their header), in the objects of an ``object`` tier on
SeaweedFS (through the backend's raw ``tamper`` hook), and in both lower
tiers of a host -> fs -> object chain.  Half the flips hit the header, byte
by byte in turn so every field is hit, half land at random in the payload.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import msgpack
import pytest
from faultkit import Report, object_tier, read_exact
from seaweed import SeaweedServer

import kvtier
from kvtier.block import framing
from kvtier.spec import CorruptBlockError
from kvtier.testing.data import block_for

NS = kvtier.Namespace("rot-model", dtype="bfloat16", tokens_per_block=16)
SIZES = (1, 100, 4096, 65_536 + 3, 300_001)


def keys_and_blocks(tag: str, n: int) -> tuple[list[bytes], list[bytes], list[int]]:
    keys = [f"rot/{tag}/{i}".encode() for i in range(n)]
    sizes = [SIZES[i % len(SIZES)] for i in range(n)]
    return keys, [block_for(k, s) for k, s in zip(keys, sizes)], sizes


def header_len(blob: bytes) -> int:
    return 6 + struct.unpack_from("<H", blob, 4)[0]


def flip(blob: bytes, index: int, rng: random.Random) -> bytes:
    """``blob`` with one to three bytes changed: header byte ``index`` or random payload bytes."""
    data = bytearray(blob)
    head = header_len(blob)
    if index % 2 == 0 or len(data) == head:
        offsets = [(index // 2) % head]
    else:
        offsets = rng.sample(range(head, len(data)), min(rng.randint(1, 3), len(data) - head))
    for offset in offsets:
        data[offset] ^= rng.randrange(1, 256)
    return bytes(data)


def fs_files(root: Path) -> dict[bytes, Path]:
    """Block files under ``root`` by the key their header names (read with plain msgpack)."""
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.name.startswith(".tmp-"):
            blob = path.read_bytes()
            if blob[:4] == framing.MAGIC:
                fields = msgpack.unpackb(blob[6:header_len(blob)], raw=True)
                found[fields[2]] = path
    return found


def rot_on_disk(root: Path, keys: list[bytes], rng: random.Random) -> int:
    files = fs_files(root)
    for index, key in enumerate(keys):
        path = files[key]
        path.write_bytes(flip(path.read_bytes(), index, rng))
    return len(keys)


def rot_by_hook(chain: kvtier.Chain, tier: int, keys: list[bytes], rng: random.Random) -> int:
    handle = chain.tiers[tier].handle
    for index, key in enumerate(keys):
        assert handle.tamper(key, lambda old, i=index: flip(old, i, rng))
    return len(keys)


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_bit_rot_on_fs(tmp_path: Path, fault_report: Report, codec: str) -> None:
    rng = random.Random(7)
    keys, blocks, sizes = keys_and_blocks(f"fs-{codec}", 120)
    config = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/d",
                         "codec": codec}]}
    with kvtier.open_chain(config, namespace=NS) as chain:
        assert chain.put(keys, blocks) == [True] * len(keys)
    rotten, sound = keys[::2], keys[1::2]
    flips = rot_on_disk(tmp_path / "d", rotten, rng)
    with kvtier.open_chain(config, namespace=NS) as chain:  # reopened: nothing cached
        got = read_exact(chain, keys, sizes)
        stats = chain.stats()["tiers"][0]
    assert [g for k, g in zip(keys, got) if k in set(rotten)] == [None] * len(rotten)
    assert [g for k, g in zip(keys, got) if k in set(sound)] == blocks[1::2]
    assert stats["corrupt"] == flips
    fault_report.record(f"bitrot_fs_{codec}", "ci", flipped=flips, detected=stats["corrupt"],
                        served_wrong=0)


def test_bit_rot_on_object(s3_server: SeaweedServer, bucket: str, fault_report: Report) -> None:
    rng = random.Random(8)
    keys, blocks, sizes = keys_and_blocks("obj", 60)
    config = {"chain": [object_tier(s3_server, bucket, codec="zstd")]}
    with kvtier.open_chain(config, namespace=NS) as chain:
        assert chain.put(keys, blocks) == [True] * len(keys)
        flips = rot_by_hook(chain, 0, keys[::2], rng)
        got = read_exact(chain, keys, sizes)
        stats = chain.stats()["tiers"][0]
    assert got[::2] == [None] * len(keys[::2])
    assert got[1::2] == blocks[1::2]
    assert stats["corrupt"] == flips
    fault_report.record("bitrot_object", "ci", flipped=flips, detected=stats["corrupt"],
                        served_wrong=0)


def test_bit_rot_through_a_chain(
    tmp_path: Path, s3_server: SeaweedServer, bucket: str, fault_report: Report
) -> None:
    """Rot in one lower tier falls through to a sound copy; rot in both is a miss."""
    rng = random.Random(9)
    keys, blocks, sizes = keys_and_blocks("chain", 60)
    config = {"chain": [
        {"name": "ram", "backend": "host", "capacity": "64MiB", "promote": False},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/d", "codec": "zstd",
         "promote": False},
        object_tier(s3_server, bucket),
    ]}
    with kvtier.open_chain(config, namespace=NS) as chain:
        assert chain.put(keys, blocks) == [True] * len(keys)
        assert chain.flush(120)
        assert chain.tiers[0].evict(keys) == [True] * len(keys)  # reads must go below
        disk_only, both = keys[:20], keys[20:40]
        flips = rot_on_disk(tmp_path / "d" / NS.hex, disk_only + both, rng)
        flips += rot_by_hook(chain, 2, both, rng)
        got = read_exact(chain, keys, sizes)
        tiers = chain.stats()["tiers"]
    assert got[:20] == blocks[:20]  # served by the object tier
    assert got[20:40] == [None] * 20
    assert got[40:] == blocks[40:]
    detected = sum(t["corrupt"] for t in tiers)
    assert (tiers[1]["corrupt"], tiers[2]["corrupt"]) == (40, 20)
    assert detected == flips
    fault_report.record("bitrot_chain", "ci", flipped=flips, detected=detected, served_wrong=0)


def test_every_single_header_byte_change_is_caught(fault_report: Report) -> None:
    """Exhaustive over the header: any value at any header byte is a miss or the exact block."""
    payload = block_for(b"exhaustive", 20_000)
    caught = exact = 0
    for codec in (framing.Codec("none"), framing.Codec("zstd", 1, 2)):
        blob = framing.encode(NS.fingerprint, b"k", payload, codec)
        for offset in range(header_len(blob)):
            for value in range(256):
                if value == blob[offset]:
                    continue
                changed = bytearray(blob)
                changed[offset] = value
                out = bytearray(len(payload))
                try:
                    framing.decode_into(bytes(changed), NS.fingerprint, b"k",
                                            memoryview(out))
                except CorruptBlockError:
                    caught += 1
                    continue
                assert out == payload, (codec, offset, value)
                exact += 1
    fault_report.record("bitrot_header_exhaustive", "ci", flipped=caught + exact,
                        detected=caught, served_wrong=0, harmless=exact)
