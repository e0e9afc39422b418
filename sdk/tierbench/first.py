"""First use of a freshly opened RAM tier, in a process of its own (for ``kvtier bench``).

A tier opened in a process that already ran others reuses memory they freed;
a tier in a new process (an engine that just started) does not.  This child
opens a one-tier chain from the entry it is given, times one ``put`` and one
``get`` of a batch of random blocks, and in the same process, beside it,
``memcpy`` into preallocated, already touched buffers (the ceiling);
which goes first is given.  It prints one JSON line: the seconds of each
and how many blocks came back wrong.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

__all__ = ["first_use", "main"]


def first_use(entry: dict[str, Any], blocks: int, size: int, kvtier_first: bool
              ) -> dict[str, Any]:
    """Run the child and answer what it printed."""
    spec = json.dumps({"entry": entry, "blocks": blocks, "size": size,
                       "kvtier_first": kvtier_first})
    done = subprocess.run([sys.executable, "-c", "from kvtier.tierbench.first import main; main()",
                           spec], capture_output=True, text=True, check=True, timeout=600)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _memcpy(blocks: list[bytes], size: int) -> tuple[float, float, int]:
    slots = [bytearray(b"\1" * size) for _ in blocks]  # touched: no page faults in the copy
    outs = [bytearray(b"\1" * size) for _ in blocks]
    start = time.perf_counter()
    for slot, block in zip(slots, blocks):
        slot[:] = block
    t_put = time.perf_counter() - start
    start = time.perf_counter()
    for out, slot in zip(outs, slots):
        out[:] = slot
    t_get = time.perf_counter() - start
    return t_put, t_get, sum(bytes(o) != b for o, b in zip(outs, blocks))


def _kvtier(entry: dict[str, Any], blocks: list[bytes], size: int) -> tuple[float, float, int]:
    from kvtier import Chain, Namespace
    from kvtier.config.chain_config import load_config

    outs = [bytearray(b"\1" * size) for _ in blocks]  # the engine's buffers exist already
    keys = [os.urandom(16) for _ in blocks]
    namespace = Namespace("kvtier-bench-first", dtype="bfloat16", tokens_per_block=16)
    config = load_config({"chain": [entry]})
    with Chain(config, namespace, job_workers=1) as chain:
        start = time.perf_counter()
        stored = chain.put(keys, blocks)
        t_put = time.perf_counter() - start
        start = time.perf_counter()
        found = chain.get(keys, outs)
        t_get = time.perf_counter() - start
    wrong = (len(keys) - sum(stored)) + (len(keys) - sum(found))
    return t_put, t_get, wrong + sum(bytes(o) != b for o, b in zip(outs, blocks))


def main() -> None:
    spec = json.loads(sys.argv[1])
    size = int(spec["size"])
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    blocks = [rng.bytes(size) for _ in range(int(spec["blocks"]))]
    if spec["kvtier_first"]:
        kv = _kvtier(spec["entry"], blocks, size)
        raw = _memcpy(blocks, size)
    else:
        raw = _memcpy(blocks, size)
        kv = _kvtier(spec["entry"], blocks, size)
    print(json.dumps({"kvtier": {"put-first": kv[0], "get-first": kv[1], "wrong": kv[2]},
                      "memcpy": {"put-first": raw[0], "get-first": raw[1], "wrong": raw[2]}}))


if __name__ == "__main__":
    main()
