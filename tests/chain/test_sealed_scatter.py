"""A large read of a sealed fs tier: the runs of kvtier.chain.scatter and the
opening of each block in the thread that read it, together.

A sealed batch goes in runs like a plaintext one, and the fs backend's
threads open each block where they read it: none is opened after the runs.
A backend that never says a block landed gets the same runs, and the chain
opens each run's blocks as its call returns.  Either way a damaged, truncated
or foreign block in any run is a miss counted as corrupt and dropped, and
every other block is served byte for byte.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fs_blocks import block_file, counted_get_into

import kvtier.backends.fs.local as fs_local
from kvtier import Namespace, open_chain
from kvtier.block.crypt import Keyring

pytest.importorskip("cryptography")

NS = Namespace("sealed-scatter-test", dtype="float32", tokens_per_block=32)
#: 12 blocks of 1 MiB: three runs of 4 MiB (scatter.RUN_MIN), so three get_into calls
SIZE, N = 1 << 20, 12
KEYS = [b"sealed-%02d" % i for i in range(N)]
#: the damaged block, in the second run
BAD = 5


def payload(i: int) -> bytes:
    return bytes([i]) * 4096 + os.urandom(SIZE - 4096)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "disk"


@pytest.fixture
def chain(tmp_path: Path, root: Path) -> Iterator[Any]:
    master = tmp_path / "master"
    master.write_text(secrets.token_hex(32))
    tier = {"name": "disk", "backend": "fs", "url": f"file://{root}", "fsync": False,
            "encrypt": f"file:{master}"}
    with open_chain({"chain": [tier]}, namespace=NS) as opened:
        yield opened


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The names of the threads that read each block's file and that opened each block."""
    seen: dict[str, list[str]] = {"read": [], "open": []}
    for name, owner, attr in (("read", fs_local.LocalStore, "_read_all_into"),
                              ("open", Keyring, "open_into")):
        real = getattr(owner, attr)

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            seen[_name].append(threading.current_thread().name)
            return _real(*args)

        monkeypatch.setattr(owner, attr, spy)
    return seen


def clear(threads: dict[str, list[str]]) -> None:
    for seen in threads.values():
        seen.clear()


def read_all(chain: Any) -> tuple[list[bool], list[bytes]]:
    outs = [bytearray(SIZE) for _ in KEYS]
    return chain.get(KEYS, outs), [bytes(o) for o in outs]


def opened_where_read(threads: dict[str, list[str]]) -> bool:
    """Every block opened, each by a thread that read blocks, the backend's among them."""
    return (len(threads["open"]) == N and set(threads["open"]) <= set(threads["read"])
            and any(name.startswith("kvtier-fs") for name in threads["open"]))


def test_a_sealed_read_lands_in_runs_each_block_opened_where_it_was_read(
    chain: Any, threads: dict[str, list[str]]
) -> None:
    payloads = [payload(i) for i in range(N)]
    assert chain.put(KEYS, payloads) == [True] * N
    calls = counted_get_into(chain)
    for _ in range(2):
        calls.clear()
        clear(threads)  # the first time, also the probe block the tier wrote and read at open
        assert read_all(chain) == ([True] * N, payloads)
        assert sorted(calls) == [4, 4, 4]  # three runs, each its own call
        assert opened_where_read(threads), threads
        # none opened by the chain after its run returned
        assert threading.main_thread().name not in threads["open"], threads
    assert chain.stats()["tiers"][0]["corrupt"] == 0


def test_a_backend_that_never_says_a_block_landed_gets_the_runs_the_chain_opening_each(
    chain: Any, threads: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fs_local, "landed", lambda buffers: None)
    payloads = [payload(i) for i in range(N)]
    assert chain.put(KEYS, payloads) == [True] * N
    calls = counted_get_into(chain)
    for _ in range(2):
        calls.clear()
        clear(threads)
        assert read_all(chain) == ([True] * N, payloads)
        assert sorted(calls) == [4, 4, 4]
        # the chain opened each block, on its calling thread, as each run returned
        main = threading.main_thread().name
        assert threads["open"] == [main] * N and main not in threads["read"], threads


def flip_ciphertext_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-SIZE // 2] ^= 0x01  # a byte of the ciphertext, not of the header or the tag
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 4096)


def foreign(root: Path) -> Callable[[Path], None]:
    """Copies another key's sound block over the file: the same size, not this key's."""
    def overwrite(path: Path) -> None:
        path.write_bytes(block_file(root, KEYS[0]).read_bytes())
    return overwrite


@pytest.mark.parametrize("landed", [True, False], ids=["opened-by-reader", "opened-by-chain"])
@pytest.mark.parametrize("damage", ["flipped ciphertext byte", "truncated", "foreign"])
def test_a_damaged_sealed_block_in_a_run_is_a_corrupt_miss_and_the_others_are_served(
    chain: Any, root: Path, monkeypatch: pytest.MonkeyPatch, damage: str, landed: bool
) -> None:
    if not landed:
        monkeypatch.setattr(fs_local, "landed", lambda buffers: None)
    payloads = [payload(i) for i in range(N)]
    assert chain.put(KEYS, payloads) == [True] * N
    assert read_all(chain) == ([True] * N, payloads)  # sound first, then one block damaged
    {"flipped ciphertext byte": flip_ciphertext_byte, "truncated": truncate,
     "foreign": foreign(root)}[damage](block_file(root, KEYS[BAD]))
    calls = counted_get_into(chain)
    before = chain.stats()["tiers"][0]
    found, outs = read_all(chain)
    assert sorted(calls) == [4, 4, 4]  # read through the runs
    assert found == [i != BAD for i in range(N)]
    assert [o for i, o in enumerate(outs) if i != BAD] == [
        p for i, p in enumerate(payloads) if i != BAD
    ]
    stats = chain.stats()["tiers"][0]
    assert stats["corrupt"] - before["corrupt"] == 1
    assert stats["hits"] - before["hits"] == N - 1
    assert chain.lookup([KEYS[BAD]]) == [None]  # dropped
