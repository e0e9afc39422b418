"""Sealed blocks sealed and opened beside the I/O, on a real fs tier with O_DIRECT.

A tier with ``encrypt`` seals each block in the fs backend's I/O thread that
writes it, and opens each block in the thread that read it
(:mod:`kvtier.block.sealed`); where a backend never says a block landed,
the tier opens it itself.  Every read is compared byte for byte; a damaged
or moved block is a miss counted as corrupt on either path.
"""

from __future__ import annotations

import random
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kvtier.backends.fs.local as fs_local
from kvtier.block import framing
from kvtier.block.crypt import Keyring
from kvtier.block.namespace import Namespace
from kvtier.chain.chain import Chain, open_chain

pytest.importorskip("cryptography")

MODEL = {"model": "sealed-io-test", "dtype": "bfloat16", "tokens_per_block": 16}
BLOCK = 2 << 20  # large enough for O_DIRECT, and aligned in the block
KEYS = [bytes([i]) * 16 for i in range(1, 9)]
NS = Namespace.of(MODEL).for_tenant("acme")


def payload(seed: int) -> bytes:
    return random.Random(seed).randbytes(BLOCK)


def tier(root: Path, key: str) -> dict[str, Any]:
    return {"name": "disk", "backend": "fs", "url": str(root), "fsync": False, "encrypt": key,
            "io_threads": 4}


def get(chain: Chain, keys: list[bytes]) -> list[bytes | None]:
    outs = [memoryview(bytearray(BLOCK)) for _ in keys]
    found = chain.get(keys, outs)
    return [bytes(o) if f else None for o, f in zip(outs, found)]


def corrupt(chain: Chain) -> int:
    return sum(t["corrupt"] for t in chain.stats()["tiers"])


def path_of(root: Path, key: bytes) -> Path:
    (path,) = (root / NS.hex).rglob(f"{key.hex()}.kvb")
    return path


@pytest.fixture
def master(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "master"
    path.write_text(secrets.token_hex(32))
    yield f"file:{path}"


@pytest.fixture
def threads_of(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The names of the threads that sealed and opened each block."""
    seen: dict[str, list[str]] = {"seal": [], "open_into": []}
    for name in seen:
        real = getattr(Keyring, name)

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            seen[_name].append(threading.current_thread().name)
            return _real(*args)

        monkeypatch.setattr(Keyring, name, spy)
    return seen


def test_blocks_are_sealed_and_opened_in_the_io_threads(
    tmp_path: Path, master: str, threads_of: dict[str, list[str]]
) -> None:
    payloads = [payload(i) for i in range(len(KEYS))]
    with open_chain({"chain": [tier(tmp_path / "root", master)]}, NS) as chain:
        for seen in threads_of.values():  # the probe block the tier writes and reads at open
            seen.clear()
        assert all(chain.put(KEYS, payloads))
        assert len(threads_of["seal"]) == len(KEYS)
        # not all in the calling thread before the first write: beside the writes
        assert any(n.startswith("kvtier-fs") for n in threads_of["seal"]), threads_of
        assert get(chain, KEYS) == payloads
        assert len(threads_of["open_into"]) == len(KEYS)
        assert any(n.startswith("kvtier-fs") for n in threads_of["open_into"]), threads_of
        assert corrupt(chain) == 0


@pytest.mark.parametrize("told", [True, False], ids=["io-thread", "tier"])
def test_a_damaged_block_is_a_corrupt_miss_whoever_opens_it(
    tmp_path: Path, master: str, monkeypatch: pytest.MonkeyPatch, told: bool
) -> None:
    root = tmp_path / "root"
    with open_chain({"chain": [tier(root, master)]}, NS) as chain:
        assert all(chain.put(KEYS[:3], [payload(i) for i in range(3)]))
    path = path_of(root, KEYS[1])
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 1  # one bit of the ciphertext
    path.write_bytes(blob)
    if not told:  # a backend that never says a block landed: the tier opens each itself
        monkeypatch.setattr(fs_local, "landed", lambda buffers: None)
    with open_chain({"chain": [tier(root, master)]}, NS) as chain:
        assert get(chain, KEYS[:3]) == [payload(0), None, payload(2)]
        assert corrupt(chain) == 1
        assert chain.lookup(KEYS[:3]) == [0, None, 0]  # the damaged block was dropped


def test_a_block_renamed_to_another_key_is_a_corrupt_miss(tmp_path: Path, master: str) -> None:
    """The header names the key and is the cipher's associated data: a block copied
    under another key's name, its header's key rewritten to match, fails its tag."""
    root = tmp_path / "root"
    with open_chain({"chain": [tier(root, master)]}, NS) as chain:
        assert all(chain.put(KEYS[:2], [payload(0), payload(1)]))
    blob = bytearray(path_of(root, KEYS[0]).read_bytes())
    header = framing.parse_header(blob, NS.fingerprint, KEYS[0])
    at = bytes(blob[: header.size]).index(KEYS[0])
    blob[at : at + len(KEYS[1])] = KEYS[1]
    framing.parse_header(blob, NS.fingerprint, KEYS[1])  # a header that parses for KEYS[1]
    path_of(root, KEYS[1]).write_bytes(blob)
    with open_chain({"chain": [tier(root, master)]}, NS) as chain:
        assert get(chain, KEYS[:2]) == [payload(0), None]
        assert corrupt(chain) == 1


@pytest.mark.parametrize("cached", [False, True], ids=["o_direct", "page-cache"])
def test_blocks_before_and_after_a_rotation_read_back_exact(
    tmp_path: Path, master: str, cached: bool
) -> None:
    root = tmp_path / "root"
    new_path = tmp_path / "new-master"
    new_path.write_text(secrets.token_hex(32))
    new = f"file:{new_path}"
    payloads = [payload(i) for i in range(len(KEYS))]
    with open_chain({"chain": [tier(root, master)]}, NS) as chain:
        assert all(chain.put(KEYS[:4], payloads[:4]))
    with open_chain({"chain": [tier(root, f"{new}, {master}")]}, NS) as chain:
        assert all(chain.put(KEYS[4:], payloads[4:]))
        if cached:
            for key in KEYS:
                path_of(root, key).read_bytes()
        assert get(chain, KEYS) == payloads
        assert corrupt(chain) == 0
        ids = {framing.parse_header(path_of(root, k).read_bytes(), NS.fingerprint, k).key_id
               for k in KEYS}
        assert len(ids) == 2


def test_a_sealed_frame_is_three_parts_sealed_once(master: str) -> None:
    seal = Keyring([bytes.fromhex(Path(master[5:]).read_text())])
    codec = framing.Codec(tenant=b"acme", seal=seal)
    data = payload(7)
    frame = framing.lazy_frame(NS.fingerprint, KEYS[0], data, codec)
    assert isinstance(frame, framing.SealedFrame) and len(frame) == 3
    assert frame.nbytes == sum(memoryview(p).nbytes for p in frame)
    assert frame[1].obj is frame[-1].obj  # one sealing for both parts
    blob = b"".join(frame)
    assert data[:4096] not in blob
    assert framing.decode(blob, NS.fingerprint, KEYS[0], seal=seal).payload == data
    plain = framing.lazy_frame(NS.fingerprint, KEYS[0], data, framing.Codec(tenant=b"acme"))
    assert type(plain) is framing.Frame
