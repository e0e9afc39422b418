"""The writer the crash test kills: ``python crash_writer.py DIR PREFIX``.

Opens a chain whose only tier is ``fs`` on ``DIR`` and puts blocks
``crash_key(PREFIX, i)`` in batches of one to three, printing ``begin FIRST
LAST`` before each put and ``done LAST`` after it (flushed), so the parent
knows which keys must exist and which may.  It never closes the chain: it
is meant to die by SIGKILL.
"""

from __future__ import annotations

import sys
import time

import kvtier
from kvtier.testing.data import block_for, crash_key

NAMESPACE = kvtier.Namespace("crash-model", dtype="bfloat16", tokens_per_block=16)
# 1 byte to 1 MiB: small ones make many renames per second, large ones long writes
SIZES = (1 << 20, 1, 4096, 300_001, 65_536, 100, 512 * 1024 + 5, 7)
LIMIT_BYTES = 96 << 20


def size_of(index: int) -> int:
    return SIZES[index % len(SIZES)]


def chain_config(directory: str) -> dict[str, object]:
    return {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{directory}"}]}


def main(directory: str, prefix: str) -> int:
    chain = kvtier.open_chain(chain_config(directory), namespace=NAMESPACE)
    index = batch = written = 0
    while written < LIMIT_BYTES:
        count = 1 + batch % 3
        keys = [crash_key(prefix, i) for i in range(index, index + count)]
        blocks = [block_for(k, size_of(i)) for i, k in zip(range(index, index + count), keys)]
        print(f"begin {index} {index + count - 1}", flush=True)
        if chain.put(keys, blocks) != [True] * count:
            print("refused", flush=True)
            return 2
        print(f"done {index + count - 1}", flush=True)
        written += sum(map(len, blocks))
        index += count
        batch += 1
    print("idle", flush=True)
    deadline = time.monotonic() + 60  # an orphaned child ends by itself
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
