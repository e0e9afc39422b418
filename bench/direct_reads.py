"""A chain's direct read of an fs tier, cold: how long the reads take, and what follows them.

    python bench/direct_reads.py DIR [--blocks 64] [--size-mib 2] [--reads 7]
        [--concurrency 16]

Stores ``--blocks`` random blocks in an ``fs`` tier at ``DIR``, then times ``--reads`` calls of
``Chain.get`` into page-aligned buffers, each after dropping the block files
from the page cache (fsync, ``POSIX_FADV_DONTNEED``).  With ``KVTIER_PHASES``
(:mod:`kvtier.observe.phases`) it splits each read into the backend's calls
(first start to last end) and the rest of the call: mostly the checks
that trail the last read.  Prints the medians.  Every block read is compared with what
was stored.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time

os.environ.setdefault("KVTIER_PHASES", "1")

from ttft_phases import drop_page_cache

from kvtier import Namespace, open_chain  # after KVTIER_PHASES is set
from kvtier.observe import phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--size-mib", type=int, default=2)
    parser.add_argument("--reads", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    size = args.size_mib << 20
    config = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{args.root}",
                         "concurrency": args.concurrency}]}
    keys = [b"direct-read-%04d" % i for i in range(args.blocks)]
    payloads = {k: os.urandom(size) for k in keys}
    with open_chain(config, namespace=Namespace("direct-reads", dtype="float32",
                                                tokens_per_block=32)) as chain:
        assert all(chain.put(keys, [payloads[k] for k in keys]))
        memory = mmap.mmap(-1, len(keys) * size)  # page-aligned, as an engine's KV rows are
        view = memoryview(memory)
        outs = [view[i * size : (i + 1) * size] for i in range(len(keys))]
        total, reads = [], []
        for _ in range(args.reads):
            drop_page_cache(args.root)
            phases.take()
            start = time.perf_counter()
            found = chain.get(keys, outs)
            total.append(time.perf_counter() - start)
            assert all(found) and all(bytes(o) == payloads[k] for k, o in zip(keys, outs))
            calls = [s for s in phases.take() if s.what == "backend get"]
            reads.append(max(s.end for s in calls) - min(s.start for s in calls))
    rest = [t - r for t, r in zip(total, reads)]
    ms = [1000 * statistics.median(v) for v in (total, reads, rest)]
    print(f"{len(keys)} blocks of {args.size_mib} MiB, median of {args.reads}: get {ms[0]:.1f} ms, "
          f"reads {ms[1]:.1f} ms, the rest {ms[2]:.1f} ms")


if __name__ == "__main__":
    main()
