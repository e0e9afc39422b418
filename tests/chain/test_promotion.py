"""Promotion and write-through do each thing once: a promoted frame keeps the
header and checksum it was read with, a header is parsed once per read, and a
frame written through is joined once.  Over real host and fs tiers; the
framing functions are wrapped only to count what they do."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvtier import Namespace, open_chain
from kvtier.block import framing
from kvtier.chain.chain import Chain

NS = Namespace("promotion-test", dtype="bfloat16", tokens_per_block=32)
SIZE = framing.ALIGN_MIN + 4096  # large enough for fs's direct reads, aligned
N = 3


def key(i: int) -> bytes:
    return b"promoted-%d" % i


def payload(i: int, size: int = SIZE) -> bytes:
    return (i.to_bytes(4, "big") + b"kv") * (size // 6) + bytes(size % 6)


def ram_over_disk(tmp_path: Path, **disk: Any) -> dict[str, Any]:
    return {"chain": [
        {"name": "ram", "backend": "host", "capacity": "64MiB", **disk.pop("ram", {})},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/disk", **disk},
    ]}


def stored_in_disk_only(chain: Chain) -> list[bytes]:
    """Blocks written to the fs tier alone, as a block demoted long ago would be."""
    keys = [key(i) for i in range(N)]
    flags, _, _ = chain.tiers[1].put_payloads(keys, [payload(i) for i in range(N)])
    assert flags == [True] * N and chain.lookup(keys) == [1] * N
    return keys


class _Counted:
    """A module whose named functions count their calls in ``counts``."""

    def __init__(self, module: Any, counts: Counter[str], names: tuple[str, ...]) -> None:
        self._module, self._counts, self._names = module, counts, names

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._module, name)
        if name not in self._names:
            return real

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._counts[name] += 1
            return real(*args, **kwargs)

        return counted


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Per framing function (and xxh3 pass over a payload), how often it ran."""
    seen: Counter[str] = Counter()
    monkeypatch.setattr(framing, "xxhash", _Counted(
        framing.xxhash, seen, ("xxh3_64_digest", "xxh3_64_intdigest")))
    if framing._xxh3copy is not None:
        monkeypatch.setattr(framing, "_xxh3copy", _Counted(
            framing._xxh3copy, seen, ("copy_xxh3_64",)))
    for name in ("parse_header", "encode", "encode_parts"):
        real = getattr(framing, name)
        monkeypatch.setattr(framing, name, lambda *a, _r=real, _n=name, **k: (
            seen.update([_n]), _r(*a, **k))[1])
    yield seen


def hash_passes(counts: Counter[str]) -> int:
    return counts["xxh3_64_digest"] + counts["xxh3_64_intdigest"] + counts["copy_xxh3_64"]


def frames_held(chain: Chain, index: int, keys: list[bytes]) -> list[bytes]:
    found = chain.tiers[index].handle.get(keys)
    assert all(f is not None for f in found)
    return [bytes(f) for f in found]


def test_a_block_promoted_from_fs_to_host_keeps_its_verified_frame(
    tmp_path: Path, counts: Counter[str]
) -> None:
    """Per promoted block: one checksum pass (the fs read's), no new header, one
    header parse; the host holds the very frame the fs tier holds."""
    with open_chain(ram_over_disk(tmp_path), namespace=NS) as chain:
        keys = stored_in_disk_only(chain)
        counts.clear()
        outs = [bytearray(SIZE) for _ in keys]
        assert chain.get(keys, outs) == [True] * N
        chain.flush()
        assert [bytes(o) for o in outs] == [payload(i) for i in range(N)]
        assert hash_passes(counts) == N, counts
        assert counts["encode"] + counts["encode_parts"] == 0, counts
        assert counts["parse_header"] == N, counts
        assert chain.lookup(keys) == [0] * N
        assert frames_held(chain, 0, keys) == frames_held(chain, 1, keys)


def test_get_bytes_parses_each_header_once_and_promotes_the_frame_read(
    tmp_path: Path, counts: Counter[str]
) -> None:
    with open_chain(ram_over_disk(tmp_path), namespace=NS) as chain:
        keys = stored_in_disk_only(chain)
        counts.clear()
        assert chain.get_bytes(keys) == [payload(i) for i in range(N)]
        chain.flush()
        assert counts["parse_header"] == N, counts
        assert hash_passes(counts) == N, counts
        assert counts["encode"] + counts["encode_parts"] == 0, counts
        assert frames_held(chain, 0, keys) == frames_held(chain, 1, keys)
        counts.clear()
        assert chain.get_bytes(keys) == [payload(i) for i in range(N)]  # from RAM now
        assert counts["parse_header"] == N, counts


def damage_payload(chain: Chain, k: bytes) -> bytes:
    """Flip a payload byte of ``k`` in the fs tier; answers the frame as it was."""
    original = frames_held(chain, 1, [k])[0]

    def flip(frame: bytes) -> bytes:
        changed = bytearray(frame)
        changed[-100] ^= 0x20
        return bytes(changed)

    assert chain.tiers[1].handle.tamper(k, flip)
    return original


def test_a_block_read_unverified_is_promoted_with_the_checksum_it_had(tmp_path: Path) -> None:
    """Read from a ``verify: false`` tier, a damaged block is served (so that tier is
    told), but promoted with its original checksum: the verifying tier above
    rejects it, rather than serving damaged bytes under a checksum made for them."""
    with open_chain(ram_over_disk(tmp_path, verify=False), namespace=NS) as chain:
        keys = stored_in_disk_only(chain)
        original = damage_payload(chain, keys[0])
        outs = [bytearray(SIZE) for _ in keys]
        assert chain.get(keys, outs) == [True] * N
        assert bytes(outs[0]) != payload(0)  # unverified: served as it is
        chain.flush()
        promoted = frames_held(chain, 0, keys[:1])[0]
        header = framing.parse_header(promoted, NS.fingerprint, keys[0])
        assert header.checksum == framing.parse_header(original, NS.fingerprint, keys[0]).checksum
        assert chain.get(keys[:1], [bytearray(SIZE)]) == [True]  # from disk again
        ram = chain.stats()["tiers"][0]
        assert ram["corrupt"] == 1 and ram["hits"] == 0
        out = bytearray(SIZE)
        assert chain.get(keys[1:2], [out]) == [True] and out == payload(1)
        assert chain.stats()["tiers"][0]["hits"] == 1  # sound blocks are served from RAM


def test_a_block_read_unverified_is_checked_before_it_is_re_encoded(tmp_path: Path) -> None:
    """Into a tier of another codec a promoted frame is re-encoded, which takes a
    new checksum: a damaged block read without verification is refused there."""
    config = ram_over_disk(tmp_path, verify=False, ram={"codec": "zstd"})
    with open_chain(config, namespace=NS) as chain:
        keys = stored_in_disk_only(chain)
        damage_payload(chain, keys[0])
        assert chain.get(keys, [bytearray(SIZE) for _ in keys]) == [True] * N
        chain.flush()
        assert chain.lookup(keys) == [1, 0, 0]
        assert chain.stats()["tiers"][0]["corrupt"] == 1
        assert chain.get_bytes(keys[1:]) == [payload(1), payload(2)]


def test_a_frame_written_through_below_a_gather_writing_tier_is_joined_once() -> None:
    """A host tier copies a gather list in by joining it; the frame written
    through to the tier below is that same ``bytes`` object, not a second join."""
    config = {"chain": [
        {"name": "ram", "backend": "host", "capacity": "64MiB"},
        {"name": "ram2", "backend": "host", "capacity": "64MiB", "write": "through"},
    ]}
    with open_chain(config, namespace=NS) as chain:
        keys = [key(i) for i in range(N)]
        payloads = [bytearray(payload(i)) for i in range(N)]
        assert chain.put(keys, payloads) == [True] * N
        chain.flush()
        above = chain.tiers[0].handle.get(keys)
        below = chain.tiers[1].handle.get(keys)
        assert all(a is b for a, b in zip(above, below))
        for i, frame in enumerate(above):
            assert framing.decode(frame, NS.fingerprint, keys[i]).payload == payloads[i]
