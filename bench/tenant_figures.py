"""The cost of one read of the per-tenant figures of an ``fs`` pool, by number of tenants.

One process opens N tenants' chains (``open_tenants``) over one ``fs`` tier on a
local root (``/dev/shm`` by default), the shared pool with ``tenants`` rules and
``capacity_scope: pool``; each tenant puts ``--blocks`` blocks and marks one
kept.  Then ``Tenants.stats()`` (what a program reads) and the Prometheus
collector's ``collect()`` (what a scrape reads: the same figures, folded into
the top ``tenants_top`` and ``other``) are timed, each the median of
``--repeat`` calls.  Every tenant's chain is open, as in an engine that served
them all: each chain's ``fs`` instance reports the pool's figures, so the
cost is what reading N instances' stats costs.

    .venv/bin/python bench/tenant_figures.py --tenants 10 100 1000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time


def measure(root: str, tenants: int, blocks: int, repeat: int) -> tuple[float, float]:
    """Milliseconds of one ``Tenants.stats()`` and of one scrape's ``collect()``."""
    from kvtier.chain.tenants import open_tenants
    from kvtier.observe.tenant_metrics import TenantsReporter

    shutil.rmtree(root, ignore_errors=True)
    config = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{root}",
                         "capacity": "1GiB", "capacity_scope": "pool", "direct_io": False,
                         "fsync": False, "concurrency": 1,
                         "tenants": {"*": {"quota": "64MiB", "keep": "1MiB"}}}]}
    # one I/O thread and one job worker per tenant's chain: 1,000 chains of the defaults
    # ran 8,000 threads, whose wake-ups, not the figures, took the machine
    with open_tenants(config, {"model": "bench"}, job_workers=1) as pool:
        for t in range(tenants):
            chain = pool.chain(f"t{t:04d}")
            keys = [b"k%d" % i for i in range(blocks)]
            assert chain.put(keys, [bytes([t % 256]) * 4096] * blocks) == [True] * blocks
            assert chain.keep(keys[:1]) == [True]
        figures = pool.stats()["tenants"]
        assert len([t for t in figures if t.startswith("t")]) == tenants, len(figures)
        reporter = TenantsReporter.__new__(TenantsReporter)  # collect() only: no endpoint
        reporter._source = lambda: pool  # type: ignore[assignment]
        from kvtier.observe.tenant_metrics import TopTenants
        reporter.top = TopTenants(20, 60.0)
        took_stats, took_collect = [], []
        for _ in range(repeat):
            start = time.perf_counter()
            pool.stats()
            took_stats.append(time.perf_counter() - start)
            start = time.perf_counter()
            reporter.collect()
            took_collect.append(time.perf_counter() - start)
    shutil.rmtree(root, ignore_errors=True)
    return statistics.median(took_stats) * 1e3, statistics.median(took_collect) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shm = "/dev/shm/kvtier-bench-tenant-figures"
    ap.add_argument("--root", default=shm if os.path.isdir("/dev/shm") else
                    "/var/tmp/kvtier-bench-tenant-figures")
    ap.add_argument("--tenants", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--blocks", type=int, default=2, help="blocks each tenant puts")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'tenants':>8} {'stats() ms':>11} {'scrape ms':>10} {'scrape us/tenant':>17}")
    for n in args.tenants:
        stats_ms, scrape_ms = measure(args.root, n, args.blocks, args.repeat)
        print(f"{n:>8} {stats_ms:>11.1f} {scrape_ms:>10.1f} {scrape_ms * 1e3 / n:>17.1f}")


if __name__ == "__main__":
    main()
