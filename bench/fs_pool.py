"""Put throughput of an ``fs`` tier with 1, 2 and 4 writer processes, with and without the pool.

Each writer process opens the ``fs`` backend on one local root with a
capacity and puts ``--blocks`` distinct blocks of ``--size`` bytes,
``--batch`` blocks per put (1: the least a put can carry, the pool's worst
case).  The writers start together (each waits for a line on stdin once
open) and the figure is all their bytes over the wall time from that start
to the last one's end, their close included.  ``pool: true`` shares one
capacity across the processes (backends/fs/pool.py); ``pool: false`` keeps
a count per process, the code before the pool.  Both run with the same
options (``fsync: false``, one I/O thread), the same blocks, and in turn:
per-process first in odd repeats, pool first in even ones, each from an
emptied root after a ``sync``.  ``--evict`` sets the capacity to a quarter of
what the writers put, so that most puts evict.

Each row gives the medians of ``--repeat`` runs: MiB/s of both, their
ratio, the median of each repeat's own ratio ("paired": its two runs ran
back to back, so a busy moment of the machine hits both), and the writers'
CPU time per block put (all their threads), which the load moves least.

The root defaults to ``/dev/shm``: on a tmpfs a write is a copy into memory,
the fastest a write gets, so the pool's share of a put is the largest, and
no writeback of the disk (other jobs', or the previous run's) slows one run
and not the next.  ``--root /var/tmp/...`` measures a disk.

    .venv/bin/python bench/fs_pool.py --blocks 400 --repeat 9
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
                 "concurrency": 1, "direct_io": False, "storage_options": {},
                 "capacity_scope": "pool" if spec["pool"] else "process"}, NS)
    data = os.urandom(spec["size"])
    keys = [f"w{spec['writer']}-{i}".encode() for i in range(spec["blocks"])]
    batch = spec["batch"]
    print("ready", flush=True)
    sys.stdin.readline()
    cpu = time.process_time()  # every thread of the process: the pool's flusher too
    stored = 0
    for i in range(0, len(keys), batch):
        part = keys[i:i + batch]
        stored += sum(handle.put(part, [data] * len(part), []))
    handle.close()
    cpu = time.process_time() - cpu
    print(json.dumps({"stored": stored, "end": time.time(), "cpu": cpu}), flush=True)


def run(root: str, writers: int, pool: bool, size: int, blocks: int, batch: int,
        evict: bool) -> tuple[float, float]:
    """All the writers' MiB/s, and their CPU microseconds per block put."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    os.sync()  # the previous run's files are written back before this one starts
    total = writers * blocks * size
    capacity = total // 4 if evict else 2 * total
    procs = []
    for w in range(writers):
        spec = {"root": root, "capacity": capacity, "pool": pool, "size": size,
                "blocks": blocks, "batch": batch, "writer": w}
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    start = time.time()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    ends, cpu = [], 0.0
    for p in procs:
        out, _ = p.communicate(timeout=600)
        report = json.loads(out.strip().splitlines()[-1])
        assert report["stored"] == blocks, report
        ends.append(report["end"])
        cpu += report["cpu"]
    shutil.rmtree(root, ignore_errors=True)
    return total / (max(ends) - start) / 2**20, cpu / (writers * blocks) * 1e6


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
    shm = "/dev/shm/kvtier-bench-pool"
    ap.add_argument("--root", default=shm if os.path.isdir("/dev/shm") else
                    "/var/tmp/kvtier-bench-pool")
    ap.add_argument("--size", default="2MiB")
    ap.add_argument("--blocks", type=int, default=200, help="blocks per writer")
    ap.add_argument("--batch", type=int, default=1, help="blocks per put")
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure; the median is kept")
    ap.add_argument("--evict", action="store_true", help="capacity: 1/4 of what is put")
    args = ap.parse_args()
    size = parse_size(args.size)
    print(f"pool coordination: {coordination(args.root):.0f} us per put (no file written)")
    print(f"{'writers':>7} {'per-process MiB/s':>18} {'pool MiB/s':>11} {'pool/per-process':>17} "
          f"{'paired':>7} {'CPU us/put':>11} {'pool':>6}")
    for writers in (1, 2, 4):
        got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for rep in range(args.repeat):  # alternated, so that a busy moment hits both
            for pool in (False, True) if rep % 2 == 0 else (True, False):
                got[pool].append(run(args.root, writers, pool, size, args.blocks, args.batch,
                                     args.evict))
        speed = {pool: statistics.median(f[0] for f in figs) for pool, figs in got.items()}
        cpu = {pool: statistics.median(f[1] for f in figs) for pool, figs in got.items()}
        # each repeat's two runs ran back to back: their ratio is less moved by the load
        paired = statistics.median(p[0] / q[0] for p, q in zip(got[True], got[False],
                                                               strict=True))
        print(f"{writers:>7} {speed[False]:>18.0f} {speed[True]:>11.0f} "
              f"{speed[True] / speed[False]:>17.2f} {paired:>7.2f} {cpu[False]:>11.0f} "
              f"{cpu[True]:>6.0f}")


if __name__ == "__main__":
    main()
