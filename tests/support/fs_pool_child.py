"""One process of an ``fs`` pool test (tests/backends/fs/test_pool.py).

Run as ``python fs_pool_child.py SPEC``.

``SPEC`` is JSON: ``mode``, ``url``, ``options`` (the tier's, beside ``url``),
``namespace`` and the mode's own fields.  The last line printed is a JSON
report.  Modes:

* ``write``: ``count`` blocks of ``size`` bytes, keys ``w<writer>-<i>``, put
  in batches of 1 to 4 through the backend; after each batch, reads of keys
  any writer may have put: each is the exact block or a miss.  With ``gate``
  (a path), it prints ``ready`` once open and starts when that file exists.
* ``churn``: puts batches of ``batch`` blocks forever (the evictor that gets
  killed); prints ``ready`` once the first batch is stored.
* ``chain``: a chain of one ``fs`` tier puts ``count`` framed blocks.
* ``credit``: puts one block (the pool gives it a credit), takes the pool's
  write lock on a connection of its own, puts ``count`` blocks one at a time
  (from the credit: no transaction), reports them and sleeps, lock held, to
  be killed before their rows are made.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import sys
import time
from typing import Any

import kvtier
from kvtier.backends.fs.pool import DB_NAME
from kvtier.plugins.registry import BackendHandle, default_registry


def block(key: bytes, size: int) -> bytes:
    """The bytes stored under ``key``: every reader knows them without asking the writer."""
    return random.Random(key).randbytes(size)


def open_backend(spec: dict[str, Any]) -> BackendHandle:
    opts = {"url": spec["url"], "capacity": None, "fsync": False, "io_threads": 4,
            "direct_io": False, "storage_options": {}, **spec.get("options", {})}
    handle = default_registry().create("fs")
    handle.open(opts, spec["namespace"])
    return handle


def write_mode(spec: dict[str, Any]) -> dict[str, Any]:
    size, count, writer, writers = spec["size"], spec["count"], spec["writer"], spec["writers"]
    rng = random.Random(writer)
    report = {"stored": 0, "refused": 0, "read_exact": 0, "read_miss": 0, "read_wrong": 0}
    handle = open_backend(spec)
    try:
        if "gate" in spec:  # all writers open before any puts: they run together
            print("ready", flush=True)
            while not os.path.exists(spec["gate"]):
                time.sleep(0.005)
        i = 0
        while i < count:
            n = min(rng.randint(1, 4), count - i)
            keys = [f"w{writer}-{j}".encode() for j in range(i, i + n)]
            flags = handle.put(keys, [block(k, size) for k in keys], [])
            report["stored"] += sum(flags)
            report["refused"] += n - sum(flags)
            i += n
            wanted = [f"w{rng.randrange(writers)}-{rng.randrange(i)}".encode() for _ in range(3)]
            for key, data in zip(wanted, handle.get(wanted), strict=True):
                if data is None:
                    report["read_miss"] += 1
                elif bytes(data) == block(key, size):
                    report["read_exact"] += 1
                else:
                    report["read_wrong"] += 1
        report.update(handle.stats())
    finally:
        handle.close()
    return report


def churn_mode(spec: dict[str, Any]) -> dict[str, Any]:
    size, batch = spec["size"], spec["batch"]
    handle = open_backend(spec)
    round_ = 0
    while True:
        keys = [f"c{round_}-{j}".encode() for j in range(batch)]
        handle.put(keys, [block(k, size) for k in keys], [])
        if round_ == 0:
            print("ready", flush=True)
        round_ += 1


def chain_mode(spec: dict[str, Any]) -> dict[str, Any]:
    tier = {"name": "disk", "backend": "fs", "url": spec["url"], **spec.get("options", {})}
    namespace = kvtier.Namespace(spec["model"], dtype="bfloat16", tokens_per_block=16)
    keys = [f"{spec['prefix']}{i}".encode() for i in range(spec["count"])]
    with kvtier.open_chain({"chain": [tier]}, namespace=namespace) as chain:
        flags = chain.put(keys, [block(k, spec["size"]) for k in keys])
    return {"stored": [k.decode() for k, f in zip(keys, flags, strict=True) if f]}


def credit_mode(spec: dict[str, Any]) -> dict[str, Any]:
    size = spec["size"]
    handle = open_backend(spec)
    assert list(handle.put([b"first"], [block(b"first", size)], [])) == [True]
    lock = sqlite3.connect(os.path.join(spec["url"], DB_NAME), timeout=30,
                           isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # no transaction of the pool's can run now
    keys = [f"c{i}".encode() for i in range(spec["count"])]
    flags = [handle.put([key], [block(key, size)], [])[0] for key in keys]
    print(json.dumps({"stored": [k.decode() for k, f in zip(keys, flags, strict=True) if f]}),
          flush=True)
    time.sleep(600)
    return {}


MODES = {"write": write_mode, "churn": churn_mode, "chain": chain_mode, "credit": credit_mode}

if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    print(json.dumps(MODES[spec["mode"]](spec)), flush=True)
