"""submit_put of 16 x 2 MiB blocks into a host tier, checked at the call against held.

    python bench/submit_put.py [ROUNDS]

Prints, per mode, the median time spent in the call and until the job is done.
Plain ``submit_put`` takes each block's checksum at the call and has its job
copy the block and compare; ``held=True`` (an engine's transfer buffers) does
neither.  The two modes alternate, so both see the same machine.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import kvtier

ns = kvtier.Namespace("held-bench", dtype="bfloat16", tokens_per_block=32)
cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "1GiB"}]}
blocks = [np.random.default_rng(i).integers(0, 255, 2 << 20, dtype=np.uint8) for i in range(16)]
res: dict[bool, tuple[list[float], list[float]]] = {False: ([], []), True: ([], [])}
with kvtier.open_chain(cfg, namespace=ns) as chain:
    for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 30):
        for held in (False, True):
            keys = [f"{r}-{held}-{i}".encode() for i in range(16)]
            start = time.perf_counter()
            job = chain.submit_put(keys, blocks, held=held)
            called = time.perf_counter()
            chain.wait([job], timeout=60)
            done = time.perf_counter()
            chain.poll()
            chain.evict(keys)
            res[held][0].append((called - start) * 1e3)
            res[held][1].append((done - start) * 1e3)
for held, (call, until) in res.items():
    print(f"held={held}: call {statistics.median(call):.2f} ms, "
          f"until done {statistics.median(until):.1f} ms")
