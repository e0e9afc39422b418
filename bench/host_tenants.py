"""The host tier's tenant bookkeeping per put: a tier of its own vs two tenants sharing one.

Puts of one block each (64 KiB, handed as ``bytes``, so no copy: the
bookkeeping is all a put costs) through the ``host`` backend, alternating
between two instances, in two regimes:

- **room**: the capacity never fills;
- **evict**: every put evicts one block (a capacity of ``--fill`` blocks).

"own": each instance a tier of its own, no ``tenants`` (as before issue 39);
"shared": two tenants in one ``share`` group, so one capacity, quotas off and
weights equal, and every eviction picks its victim tenant by
``TenantRules``.  Both variants run in turns in one process; the figures are
medians of ``--repeat`` runs of ``--puts`` puts, microseconds per put of the
process's CPU time, and the median of each repeat's own difference.

    .venv/bin/python bench/host_tenants.py --repeat 9
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvtier.plugins.registry import BackendHandle, default_registry

SIZE = 64 << 10


def open_pair(shared: bool, capacity: int, run: int) -> list[BackendHandle]:
    pair = []
    for tenant in ("a", "b"):
        extra = {"tenant": tenant, "share": f"bench-{run}"} if shared else {}
        handle = default_registry().create("host")
        handle.open({"capacity": capacity, "sizing_sample": 0.0, "prefault": 0, **extra},
                    tenant * 32)
        pair.append(handle)
    return pair


def per_put(shared: bool, puts: int, capacity: int, run: int) -> float:
    pair = open_pair(shared, capacity, run)
    data = bytes(SIZE)
    keys = [i.to_bytes(16, "little") for i in range(puts)]
    start = time.process_time()
    for i, key in enumerate(keys):
        pair[i % 2].put([key], [data], [])
    spent = time.process_time() - start
    for handle in pair:
        handle.close()
    return spent / puts * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--puts", type=int, default=20_000)
    parser.add_argument("--fill", type=int, default=64, help="blocks the evict regime holds")
    args = parser.parse_args()
    print("| regime | own | shared | paired |\n|---|--:|--:|--:|")
    for regime, capacity in (("room", SIZE * args.puts * 2), ("evict", SIZE * args.fill)):
        own, shared, paired = [], [], []
        for run in range(args.repeat):
            order = (False, True) if run % 2 else (True, False)
            got = {s: per_put(s, args.puts, capacity, run) for s in order}
            own.append(got[False]), shared.append(got[True])
            paired.append(got[True] - got[False])
        print(f"| {regime} | {statistics.median(own):.2f} | {statistics.median(shared):.2f} | "
              f"{statistics.median(paired):+.2f} |")


if __name__ == "__main__":
    main()
