"""One writer of tests/backends/object/test_shared_capacity.py, in a process of its own.

Run as ``python object_writer_child.py SPEC``.  ``SPEC`` is JSON: ``options``
(the ``object`` tier's, every option given), ``namespace``, ``writer``,
``count``, ``batch`` and ``size``.  The child opens the backend, prints
``ready``, waits for a line on stdin (so that every writer starts at once),
puts ``count`` blocks of ``size`` bytes in batches of ``batch`` (keys
``w<writer>-<i>``), and prints a JSON report as its last line: blocks stored,
and the backend's stats before it closed.
"""

from __future__ import annotations

import json
import random
import sys

from kvtier.plugins.registry import default_registry


def block(key: bytes, size: int) -> bytes:
    """The bytes stored under ``key``: every reader knows them without asking the writer."""
    return random.Random(key).randbytes(size)


def main() -> None:
    spec = json.loads(sys.argv[1])
    handle = default_registry().create("object")
    handle.open(spec["options"], spec["namespace"])
    try:
        print("ready", flush=True)
        if not sys.stdin.readline():
            raise SystemExit("stdin closed before the start")
        stored = 0
        for start in range(0, spec["count"], spec["batch"]):
            keys = [f"w{spec['writer']}-{i}".encode()
                    for i in range(start, min(start + spec["batch"], spec["count"]))]
            stored += sum(handle.put(keys, [block(k, spec["size"]) for k in keys], []))
        stats = dict(handle.stats())
    finally:
        handle.close()
    print(json.dumps({"stored": stored, "stats": stats}), flush=True)


if __name__ == "__main__":
    main()
