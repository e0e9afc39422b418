"""The cost per put of measuring the ``fs`` pool's own files, with 1 to 1,000 namespaces.

The capacity of a pooled root counts the pool's own files (its index, log,
journals, and each namespace's ``index.kvi``: ``backends/fs/pool_files.py``),
measured when room is taken.  A listing of them takes a ``stat`` per
namespace, so a root shared by many tenants (a namespace each) made every put
that takes room pay for all of them.  Here the root holds ``N`` namespaces
closed before (an ``index.kvi`` of ``--entries`` entries each), and one
namespace puts one block at a time into a full pool (``--fill`` blocks beside
the namespaces' ``index.kvi``): each put evicts one block and takes room in
a transaction, the case where the measure counts most.  Root in
``/dev/shm`` by default (a write is a copy into memory, so the pool's share
of a put is the largest).

Two variants in the same process, in turns (odd repeats the other way round),
each on a fresh root:

- **every grant** (the code before): the root listed at every measure
  (``pool_files.STALE_S = 0``);
- **cached**: a listing serves until the root changes, for at most a second and
  a hundred times as long as it took (the code now).

Figures: medians of ``--repeat`` runs of ``--puts`` puts, in microseconds of the
process's CPU time (every thread) and of wall time per put, and the listings of
the root made per put.

    .venv/bin/python bench/fs_pool_namespaces.py --repeat 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import time

NS = "0123456789abcdef0123456789abcdef"


def make_namespaces(root: str, count: int, entries: int) -> None:
    """``count`` namespaces beside the one that puts, each with an ``index.kvi`` of
    ``entries`` entries (its size only matters here: it is ``stat``-ed, not read)."""
    from kvtier.backends.fs.index import INDEX_NAME

    body = b"".join(struct.pack("<IQ", 16, 65536) + os.urandom(16) for _ in range(entries))
    for i in range(count - 1):
        folder = os.path.join(root, f"{i:032x}")
        os.makedirs(folder)
        with open(os.path.join(folder, INDEX_NAME), "wb") as f:
            f.write(body)


def per_put(root: str, namespaces: int, cached: bool, puts: int, size: int, fill: int,
            entries: int) -> tuple[float, float, float]:
    """CPU and wall microseconds per put, and the root's listings per put."""
    from kvtier.backends.fs import pool_files
    from kvtier.plugins.registry import default_registry

    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    make_namespaces(root, namespaces, entries)
    pool_files.STALE_S = 1.0 if cached else 0.0
    handle = default_registry().create("fs")
    # the capacity holds the namespaces' index.kvi too (4 KiB each on tmpfs): room for them
    capacity = fill * size + namespaces * 4096
    handle.open({"url": root, "capacity": capacity, "capacity_scope": "pool",
                 "fsync": False, "concurrency": 1, "direct_io": False,
                 "storage_options": {}}, NS)
    data = os.urandom(size)
    for i in range(4 * fill):  # full before the clock starts: puts evict
        handle.put([b"f%d" % i], [data], [])
    time.sleep(0.1)  # the root quiet since its last change (its journal made at the first put)
    files = pool_files.own_files(root)
    listed = files.listings
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(puts):
        assert handle.put([b"k%d" % i], [data], []) == [True]
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    listings = files.listings - listed
    stats = handle.stats()
    handle.close()
    assert stats["pool_evictions"] >= puts + 2 * fill, stats  # each put evicted one block
    shutil.rmtree(root, ignore_errors=True)
    return cpu / puts * 1e6, took / puts * 1e6, listings / puts


def main() -> None:
    from kvtier.plugins.options import parse_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shm = "/dev/shm/kvtier-bench-namespaces"
    ap.add_argument("--root", default=shm if os.path.isdir("/dev/shm") else
                    "/var/tmp/kvtier-bench-namespaces")
    ap.add_argument("--namespaces", default="1,100,1000")
    ap.add_argument("--size", default="16KiB")
    ap.add_argument("--puts", type=int, default=1000)
    ap.add_argument("--fill", type=int, default=64, help="blocks the capacity holds")
    ap.add_argument("--entries", type=int, default=64, help="entries of each index.kvi")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    size = parse_size(args.size)
    print(f"{'namespaces':>10} {'CPU us/put before':>18} {'CPU us/put now':>15} "
          f"{'wall before':>12} {'wall now':>9} {'listings/put before':>20} {'now':>6}")
    for count in (int(n) for n in args.namespaces.split(",")):
        got: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
        for rep in range(args.repeat):
            for cached in (False, True) if rep % 2 == 0 else (True, False):
                got[cached].append(per_put(args.root, count, cached, args.puts, size,
                                           args.fill, args.entries))
        cpu, wall, listed = ([statistics.median(f[k] for f in got[c]) for c in (False, True)]
                             for k in (0, 1, 2))
        print(f"{count:>10} {cpu[0]:>18.1f} {cpu[1]:>15.1f} {wall[0]:>12.1f} {wall[1]:>9.1f} "
              f"{listed[0]:>20.3f} {listed[1]:>6.3f}")


if __name__ == "__main__":
    main()
