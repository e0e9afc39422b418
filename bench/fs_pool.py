"""Put throughput of an ``fs`` tier with 1, 2 and 4 writer processes, with and without the pool.

Each writer process opens the ``fs`` backend on one local root with a
capacity and puts ``--blocks`` distinct blocks of ``--size`` bytes, one block
per put (as an engine's store jobs do).  The writers start together (each
waits for a line on stdin once open) and the figure is all their bytes over
the wall time from that start to the last one's end.  ``pool: true`` shares
one capacity across the processes (backends/fs/pool.py); ``pool: false``
keeps a count per process, the code before the pool.  ``--evict`` sets the
capacity to a quarter of what the writers put, so that most puts evict.

    .venv/bin/python bench/fs_pool.py --root /var/tmp/kvtier-bench --size 2MiB
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

NS = "0123456789abcdef0123456789abcdef"


def writer(spec: dict) -> None:
    from kvtier.plugins.registry import default_registry

    handle = default_registry().create("fs")
    handle.open({"url": spec["root"], "capacity": spec["capacity"], "fsync": False,
                 "io_threads": 1, "direct_io": False, "storage_options": {},
                 "pool": spec["pool"]}, NS)
    data = os.urandom(spec["size"])
    keys = [f"w{spec['writer']}-{i}".encode() for i in range(spec["blocks"])]
    print("ready", flush=True)
    sys.stdin.readline()
    stored = sum(handle.put([key], [data], [])[0] for key in keys)
    handle.close()
    print(json.dumps({"stored": stored, "end": time.time()}), flush=True)


def run(root: str, writers: int, pool: bool, size: int, blocks: int, evict: bool) -> float:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    total = writers * blocks * size
    capacity = total // 4 if evict else 2 * total
    procs = []
    for w in range(writers):
        spec = {"root": root, "capacity": capacity, "pool": pool, "size": size,
                "blocks": blocks, "writer": w}
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    start = time.time()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    ends = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        report = json.loads(out.strip().splitlines()[-1])
        assert report["stored"] == blocks, report
        ends.append(report["end"])
    shutil.rmtree(root, ignore_errors=True)
    return total / (max(ends) - start) / 2**20


def coordination(root: str, puts: int = 2000) -> float:
    """Microseconds of the pool's own work per put of one block (no file written)."""
    from kvtier.backends.fs.pool import SharedPool

    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    pool = SharedPool(root, NS, 1 << 50, "namespace", None, 10.0)
    start = time.perf_counter()
    for i in range(puts):
        key = b"k%d" % i
        pool.reserve([key], [2 << 20], lambda victims: [True] * len(victims))
        pool.settle(key, 2 << 20)
    took = time.perf_counter() - start
    pool.close()
    shutil.rmtree(root, ignore_errors=True)
    return took / puts * 1e6


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        writer(json.loads(sys.argv[2]))
        return
    from kvtier.plugins.options import parse_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="/var/tmp/kvtier-bench-pool")
    ap.add_argument("--size", default="2MiB")
    ap.add_argument("--blocks", type=int, default=200, help="blocks per writer")
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure; the median is kept")
    ap.add_argument("--evict", action="store_true", help="capacity: 1/4 of what is put")
    args = ap.parse_args()
    size = parse_size(args.size)
    print(f"pool coordination: {coordination(args.root):.0f} us per put (no file written)")
    print(f"{'writers':>7} {'per-process MiB/s':>18} {'pool MiB/s':>11} {'pool/per-process':>17}")
    for writers in (1, 2, 4):
        got: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeat):  # alternated, so that a busy moment hits both
            for pool in (False, True):
                got[pool].append(run(args.root, writers, pool, size, args.blocks, args.evict))
        best = {pool: statistics.median(figures) for pool, figures in got.items()}
        print(f"{writers:>7} {best[False]:>18.0f} {best[True]:>11.0f} "
              f"{best[True] / best[False]:>17.2f}")


if __name__ == "__main__":
    main()
