"""The writer the crash-safety group kills: ``python -m kvtier.testing.crash_child CONFIG``.

``CONFIG`` is a JSON object: ``backend`` (name or import path), ``options``
(as the test's ``backend_options`` gave them), ``namespace``, ``prefix`` (of
this round's keys), ``limit`` (largest block size) and ``max_bytes`` (stop
writing after this much, then wait to be killed).

It opens the backend exactly as the test did and puts
:func:`~kvtier.testing.data.crash_key` blocks in small batches, printing
``begin FIRST LAST`` before each put and ``done LAST`` after it, flushed, so
the parent knows which keys may exist.  It never closes the backend: it is
meant to die by SIGKILL.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from kvtier.spec import BytesLike

from .data import block_for, crash_key, crash_size
from .resolve import resolve_backend, validate_options

__all__ = ["main"]

#: A child whose parent died without killing it stops on its own.
_DEADLINE = time.monotonic() + 120.0


def main(argv: list[str]) -> int:
    config: dict[str, Any] = json.loads(argv[0])
    registry, name = resolve_backend(config["backend"])
    options = validate_options(config["backend"], config["options"])
    handle = registry.create(name)
    handle.open(options, config["namespace"])
    prefix, limit = str(config["prefix"]), int(config["limit"])
    print("open", flush=True)
    index = written = batch = 0
    while written < int(config["max_bytes"]):
        count = 1 + batch % 3  # batches of one to three blocks
        keys = [crash_key(prefix, i) for i in range(index, index + count)]
        # built before "begin" so the time between the lines is the put alone
        blocks: list[BytesLike] = [
            block_for(k, crash_size(i, limit)) for i, k in zip(range(index, index + count), keys)
        ]
        print(f"begin {index} {index + count - 1}", flush=True)
        evicted: list[tuple[bytes, BytesLike]] = []
        handle.put(keys, blocks, evicted)
        print(f"done {index + count - 1}", flush=True)
        written += sum(len(b) for b in blocks)
        index += count
        batch += 1
    print("idle", flush=True)
    while time.monotonic() < _DEADLINE:  # wait for the parent's SIGKILL
        time.sleep(0.05)
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
