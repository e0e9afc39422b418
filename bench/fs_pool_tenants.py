"""The cost of the ``fs`` pool's quota bookkeeping per put: the pool with and without ``tenants``.

Puts of one block each through the ``fs`` backend on a local root (``/dev/shm`` by
default: a write is a copy into memory, so the pool's share of a put is the
largest), with the shared pool, in two regimes:

- **room**: the pool never fills and no quota is reached (a capacity and, with
  tenants, a quota of 1 PiB): most puts come from the process's credit, and a
  transaction, where the quota's room is read, comes every few puts;
- **evict**: every put evicts one block: without tenants by the pool's
  ``capacity`` (``--fill`` blocks), with tenants by the tenant's quota (the same
  bytes) under a capacity that never fills; so each put takes a transaction,
  the lease, and the choice of its tenant's victim.

Both variants run in the same process, in turns (without tenants first in odd
repeats), each on an emptied root; the figures are the medians of ``--repeat``
runs of ``--puts`` puts, in microseconds per put of wall time and of the
process's CPU time (every thread), and the median of each repeat's own
difference ("paired": its two runs ran back to back, so a busy moment of the
machine hits both).

    .venv/bin/python bench/fs_pool_tenants.py --repeat 7
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time

NS = "0123456789abcdef0123456789abcdef"
PIB = 1 << 50


def per_put(root: str, regime: str, tenants: bool, puts: int, size: int,
            fill: int) -> tuple[float, float]:
    """Microseconds per put of one ``size``-byte block through the ``fs`` backend: wall
    time, and CPU time of the process (every thread: the pool's flusher too)."""
    from kvtier.plugins.registry import default_registry

    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    bound = fill * size if regime == "evict" else PIB
    handle = default_registry().create("fs")
    options = {"url": root, "capacity": PIB if tenants else bound, "capacity_scope": "pool",
               "fsync": False, "concurrency": 1, "direct_io": False, "storage_options": {}}
    if tenants:
        options.update(tenants={"*": {"quota": bound}}, tenant="acme")
    handle.open(options, NS)
    data = os.urandom(size)
    for i in range(fill if regime == "evict" else 0):  # full before the clock starts
        handle.put([b"f%d" % i], [data], [])
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(puts):
        assert handle.put([b"k%d" % i], [data], []) == [True]
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    stats = handle.stats()
    handle.close()
    if regime == "evict":  # every put evicted one block, by the capacity or by the quota
        assert stats["pool_evictions"] >= puts, stats
    shutil.rmtree(root, ignore_errors=True)
    return took / puts * 1e6, cpu / puts * 1e6


def main() -> None:
    from kvtier.plugins.options import parse_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shm = "/dev/shm/kvtier-bench-tenants"
    ap.add_argument("--root", default=shm if os.path.isdir("/dev/shm") else
                    "/var/tmp/kvtier-bench-tenants")
    ap.add_argument("--size", default="64KiB")
    ap.add_argument("--puts", type=int, default=2000)
    ap.add_argument("--fill", type=int, default=64, help="blocks the bound holds (evict)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    size = parse_size(args.size)
    print(f"{'regime':>6} {'without us/put':>15} {'with us/put':>12} {'paired us':>10} "
          f"{'CPU without':>12} {'CPU with':>9} {'CPU paired':>11}")
    for regime in ("room", "evict"):
        got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for rep in range(args.repeat):
            for tenants in (False, True) if rep % 2 == 0 else (True, False):
                got[tenants].append(per_put(args.root, regime, tenants, args.puts, size,
                                            args.fill))
        cells = []
        for k in (0, 1):  # wall, CPU
            off, on = (statistics.median(f[k] for f in got[t]) for t in (False, True))
            # each repeat's two runs ran back to back: their difference is less moved by load
            paired = statistics.median(b[k] - a[k] for a, b in zip(got[False], got[True],
                                                                  strict=True))
            cells += [off, on, paired]
        print(f"{regime:>6} {cells[0]:>15.1f} {cells[1]:>12.1f} {cells[2]:>10.1f} "
              f"{cells[3]:>12.1f} {cells[4]:>9.1f} {cells[5]:>11.1f}")


if __name__ == "__main__":
    main()
