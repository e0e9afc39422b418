"""One tenant's process on a shared ``fs`` pool (tests/backends/fs/test_pool_tenants_noisy.py).

Run as ``python fs_tenant_child.py SPEC``; ``SPEC`` is JSON: ``url``, ``namespace``,
``options`` (the tier's, beside ``url``), ``mode`` and the mode's own fields.  It
prints ``ready`` once open and starts when the file ``gate`` exists; the last
line printed is a JSON report.  Modes:

* ``flood``: puts distinct blocks of ``size`` bytes, one at a time, until the
  file ``stop`` exists (the noisy tenant); reports the bytes it put.
* ``work``: ``steps`` accesses to a working set of ``keys`` blocks of ``size``
  bytes, drawn by a seeded skewed law (the same sequence in every run): a get;
  a hit must be the exact block, a miss puts it back (a cache's behaviour).
  Reports hits, misses and wrong blocks (never expected).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

from kvtier.plugins.registry import BackendHandle, default_registry


def block(key: bytes, size: int) -> bytes:
    """The bytes stored under ``key``: every reader knows them without asking the writer."""
    return random.Random(key).randbytes(size)


def open_backend(spec: dict[str, Any]) -> BackendHandle:
    opts = {"url": spec["url"], "capacity": None, "fsync": False, "concurrency": 2,
            "direct_io": False, "storage_options": {}, **spec.get("options", {})}
    handle = default_registry().create("fs")
    handle.open(opts, spec["namespace"])
    return handle


def flood(handle: BackendHandle, spec: dict[str, Any]) -> dict[str, Any]:
    stored = put = 0
    while not os.path.exists(spec["stop"]):
        key = f"flood-{put}".encode()
        stored += handle.put([key], [block(key, spec["size"])], [])[0]
        put += 1
    return {"stored": stored, "put_bytes": put * spec["size"]}


def work(handle: BackendHandle, spec: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(spec.get("seed", 7))
    keys = [f"work-{i}".encode() for i in range(spec["keys"])]
    hits = misses = wrong = 0
    for _ in range(spec["steps"]):
        # skewed: the first keys are asked most (a working set with hot prefixes)
        key = keys[min(int(rng.paretovariate(spec.get("alpha", 0.5))) - 1, len(keys) - 1)]
        data = handle.get([key])[0]
        if data is None:
            misses += 1
            handle.put([key], [block(key, spec["size"])], [])
        elif bytes(data) == block(key, spec["size"]):
            hits += 1
        else:
            wrong += 1
        if spec.get("pace_s"):
            time.sleep(spec["pace_s"])
    return {"hits": hits, "misses": misses, "wrong": wrong}


def main() -> None:
    spec = json.loads(sys.argv[1])
    handle = open_backend(spec)
    try:
        print("ready", flush=True)
        while not os.path.exists(spec["gate"]):
            time.sleep(0.005)
        report = {"flood": flood, "work": work}[spec["mode"]](handle, spec)
        report["stats"] = {k: v for k, v in handle.stats().items() if isinstance(v, int)}
    finally:
        handle.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
