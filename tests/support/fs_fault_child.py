"""Faults of one block file on an fs tier, for tests/backends/fs/test_block_faults.py.

Run as ``python fs_fault_child.py MODE DIR`` in a process without DAC
override (``capsh --drop=cap_dac_override,cap_dac_read_search --``), so
that a file's mode bits stop this process even though it runs as root.
Prints one JSON line of what it saw; ``{"skip": ...}`` when the modes do
not stop it after all.

Modes:

* ``read``: 20 blocks stored, one made unreadable (``chmod 000``), then the
  20 read in batches, one at a time, looked up, and read again;
* ``write``: one key's directory made unwritable, then 16 stores of one
  block each at the same time, a batch of 16, and a store after them;
* ``evict``: a tier of 4 blocks' capacity whose least recently used block
  cannot be removed, then stores that push it out;
* ``root``: the namespace's directory made unreachable (``chmod 000``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import kvtier

NAMESPACE = kvtier.Namespace("block-faults", dtype="bfloat16", tokens_per_block=16)
SIZE = 4096


def payload(i: int) -> bytes:
    return bytes([i % 251 + 1]) * (SIZE - 16) + i.to_bytes(16, "big")


def keys(n: int, tag: int = 1) -> list[bytes]:
    """Keys whose files lie in directories of their own (the first two bytes differ)."""
    return [bytes([tag, i]) + b"-fault" for i in range(n)]


def without_dac(command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``command`` without DAC override where this process has it (root); for the tests."""
    import pytest

    if os.geteuid() == 0:
        capsh = shutil.which("capsh")
        if capsh is None:
            pytest.skip("capsh (libcap2-bin) is needed to drop DAC override as root")
        inner = " ".join(shlex.quote(part) for part in command)
        command = [capsh, "--drop=cap_dac_override,cap_dac_read_search", "--", "-c",
                   f"exec {inner}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def open_chain(directory: str, **fs: Any) -> Any:
    tier = {"name": "disk", "backend": "fs", "url": directory, "direct_io": False, **fs}
    return kvtier.open_chain({"chain": [tier]}, namespace=NAMESPACE)


def file_of(directory: str, key: bytes) -> Path:
    (found,) = Path(directory).rglob(f"{key.hex()}.kvb")
    return found


def tier_figures(chain: Any) -> dict[str, Any]:
    (tier,) = chain.stats()["tiers"]
    keep = ("hits", "misses", "puts", "refused", "failed", "errors", "healthy")
    out = {name: tier.get(name) for name in keep}
    out["block_faults"] = tier["backend_stats"].get("block_faults")
    return out


def reads(chain: Any, ks: list[bytes]) -> list[bool]:
    """Which keys read back byte for byte (a batch get)."""
    outs = [bytearray(SIZE) for _ in ks]
    found = chain.get(ks, outs)
    return [f and bytes(o) == payload(k[1]) for f, o, k in zip(found, outs, ks)]


def blocked(path: Path) -> bool:
    try:
        with open(path, "rb"):
            return False
    except PermissionError:
        return True


def read_mode(directory: str) -> dict[str, Any]:
    ks = keys(20)
    with open_chain(directory) as chain:
        assert chain.put(ks, [payload(i) for i in range(20)]) == [True] * 20
    bad = file_of(directory, ks[7])
    bad.chmod(0)
    if not blocked(bad):
        return {"skip": "chmod 000 does not stop this process"}
    with open_chain(directory) as chain:
        batches = [reads(chain, ks) for _ in range(3)]
        singles = [reads(chain, [k])[0] for k in ks]
        lookup = chain.lookup(ks)
        again = reads(chain, ks)
        return {"batches": batches, "singles": singles, "lookup": lookup, "again": again,
                **tier_figures(chain)}


def write_mode(directory: str) -> dict[str, Any]:
    ks = keys(16)
    with open_chain(directory) as chain:
        # the directory the sixth key's file goes into: made, emptied, unwritable
        assert chain.put([ks[5]], [payload(5)]) == [True]
        bad_dir = file_of(directory, ks[5]).parent
        assert chain.evict([ks[5]]) == 1
        bad_dir.chmod(0o555)
        if not blocked_dir(bad_dir):
            return {"skip": "chmod 555 does not stop this process"}
        results: list[Any] = [None] * 16
        start = threading.Barrier(16)

        def store(i: int) -> None:
            start.wait()
            results[i] = chain.put([ks[i]], [payload(i)])[0]

        threads = [threading.Thread(target=store, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        batch_keys = keys(16, tag=2)
        batch_keys[5] = ks[5]
        batch = chain.put(batch_keys, [payload(k[1]) for k in batch_keys])
        after = chain.put(keys(1, tag=3), [payload(0)])
        read_back = reads(chain, [k for k in ks + batch_keys if k != ks[5]])
        bad_dir.chmod(0o755)
        return {"concurrent": results, "batch": batch, "after": after,
                "read_back": read_back, **tier_figures(chain)}


def blocked_dir(path: Path) -> bool:
    try:
        (path / "probe").touch()
    except PermissionError:
        return True
    (path / "probe").unlink()
    return False


def evict_mode(directory: str) -> dict[str, Any]:
    ks = keys(8)
    with open_chain(directory, capacity=4 * (SIZE + 256)) as chain:
        assert chain.put(ks[:4], [payload(i) for i in range(4)]) == [True] * 4
        stuck = file_of(directory, ks[0]).parent
        stuck.chmod(0o555)
        if not blocked_dir(stuck):
            return {"skip": "chmod 555 does not stop this process"}
        try:
            stored = [chain.put([k], [payload(i + 4)])[0] for i, k in enumerate(ks[4:])]
            read_back = reads(chain, ks[4:])
            return {"stored": stored, "read_back": read_back, **tier_figures(chain)}
        finally:
            stuck.chmod(0o755)


def root_mode(directory: str) -> dict[str, Any]:
    ks = keys(20)
    with open_chain(directory) as chain:
        assert chain.put(ks, [payload(i) for i in range(20)]) == [True] * 20
    nsroot = file_of(directory, ks[0]).parent.parent.parent
    with open_chain(directory) as chain:
        nsroot.chmod(0)
        try:
            if not blocked_dir(nsroot):
                return {"skip": "chmod 000 does not stop this process"}
            first = reads(chain, ks)
            figures = tier_figures(chain)
            second = reads(chain, ks)  # within the back-off: not even tried
            return {"first": first, "second": second, "after_first": figures,
                    **tier_figures(chain)}
        finally:
            nsroot.chmod(0o755)


MODES = {"read": read_mode, "write": write_mode, "evict": evict_mode, "root": root_mode}

if __name__ == "__main__":
    mode, directory = sys.argv[1], sys.argv[2]
    os.makedirs(directory, exist_ok=True)
    print(json.dumps(MODES[mode](directory)))
