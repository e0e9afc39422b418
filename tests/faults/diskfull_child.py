"""The disk-full scenario, run in its own process: ``python diskfull_child.py MODE DIR``.

``MODE`` is ``tmpfs`` (DIR is a small tmpfs the parent mounted) or
``fsize:BYTES`` (this process gets RLIMIT_FSIZE = BYTES: no file may grow
past it, a real kernel limit that needs no privileges).  Prints one JSON
object with what it saw; the test asserts on it.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgpack

import kvtier
import kvtier.chain.health as tier_module
from kvtier.block import framing
from kvtier.chain.catalog import CATALOG_HEX
from kvtier.spec import CorruptBlockError
from kvtier.testing.data import block_for

NS = kvtier.Namespace("full-model", dtype="bfloat16", tokens_per_block=16)
SMALL, LARGE = 64 * 1024, 256 * 1024


def files_on_disk(root: Path) -> tuple[int, int, int]:
    """(temporary files, whole checked blocks, damaged blocks) under ``root``."""
    tmp = whole = damaged = 0
    for path in root.rglob("*"):
        if not path.is_file() or CATALOG_HEX in path.parts:
            continue  # the namespace's descriptor (kvtier.chain.catalog) is no KV block
        if path.name.startswith(".tmp-"):
            tmp += 1
            continue
        blob = path.read_bytes()
        try:
            head = 6 + int.from_bytes(blob[4:6], "little")
            key = msgpack.unpackb(blob[6:head], raw=True)[2]
            size = framing.parse_header(blob, NS.fingerprint, key).raw_len
            framing.decode_into(blob, NS.fingerprint, key, memoryview(bytearray(size)))
            whole += 1
        except Exception:
            damaged += 1
    return tmp, whole, damaged


def read(chain: kvtier.Chain, keys: list[bytes], size: int) -> list[bool]:
    outs = [bytearray(size) for _ in keys]
    found = chain.get(keys, outs)
    return [f and bytes(o) == block_for(k, size) for k, o, f in zip(keys, outs, found)]


def main(mode: str, directory: str) -> dict[str, Any]:
    if mode.startswith("fsize:"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
        limit = int(mode.split(":")[1])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    tier_module._BACKOFF_FIRST = 0.02  # recovery is waited for below; keep it short
    tier_module._BACKOFF_MAX = 0.05
    config = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{directory}"}]}
    existing = [f"old/{i}".encode() for i in range(6)]
    large = [f"big/{i}".encode() for i in range(24)]
    out: dict[str, Any] = {"mode": mode}
    with kvtier.open_chain(config, namespace=NS) as chain:
        out["existing_stored"] = chain.put(existing, [block_for(k, SMALL) for k in existing])
        stored = []
        failed = 0
        reads_after_failure: list[bool] = []
        direct_after_failure: list[bool] = []
        for key in large:  # one block a call: each failure is its own
            ok = chain.put([key], [block_for(key, LARGE)])[0]
            if ok:
                stored.append(key)
                continue
            failed += 1
            if failed == 1:  # at once, before any back-off has run out
                reads_after_failure = read(chain, existing, SMALL)
                blobs = chain.tiers[0].handle.get(existing)
                direct_after_failure = [
                    b is not None and _decodes(b, k, SMALL) for k, b in zip(existing, blobs)
                ]
            time.sleep(0.08)  # let the back-off pass so the next put really tries
        out["attempted"] = len(large)
        out["failed"] = failed
        out["stats_errors"] = chain.stats()["tiers"][0]["errors"]
        out["stats_refused"] = chain.stats()["tiers"][0]["refused"]
        out["reads_right_after_failure"] = reads_after_failure
        out["backend_reads_right_after_failure"] = direct_after_failure
        time.sleep(0.08)
        out["reads_after_backoff"] = read(chain, existing, SMALL)
        out["stored_large_exact"] = all(read(chain, stored, LARGE)) if stored else True
        out["tmp_files"], out["whole_files"], out["damaged_files"] = files_on_disk(
            Path(directory))
        # room again: stores work once the tier has recovered by itself
        chain.evict(stored)
        time.sleep(0.08)
        probe = [b"probe"]
        out["store_after_room"] = chain.put(probe, [block_for(probe[0], SMALL)])
        out["probe_exact"] = read(chain, probe, SMALL)
    return out


def _decodes(blob: Any, key: bytes, size: int) -> bool:
    out = bytearray(size)
    try:
        framing.decode_into(blob, NS.fingerprint, key, memoryview(out))
    except CorruptBlockError:
        return False
    return bytes(out) == block_for(key, size)


if __name__ == "__main__":
    os.makedirs(sys.argv[2], exist_ok=True)
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
