"""The cost of tenants' quotas per put in the ``redis`` backend, counted on the server.

    python bench/redis_tenants.py [--repeat 5] [--puts 3000] [--block-size 64KiB]

Starts Debian's ``redis-server`` on a free port of 127.0.0.1 (the test
fixture ``tests/support/redis_server.py``), then times one process putting
distinct blocks, one per put, through the backend, in turns (without first in
odd repeats), each in an emptied database:

* without: a namespace's own capacity of 64 MiB (no ``tenants``);
* with: ``tenants`` (two tenants' quotas of 32 MiB each) in a pool of 64 MiB,
  the writer's quota the bound (its own victims, chosen by its recency).

Both fill first: the times are the medians of the puts after the first
third of the run, of which every one evicts one block (the script's most
work: the pool reads every tenant's bytes and the rules, then evicts).
Every block put is checked as stored.  Prints microseconds per put and the
median of each repeat's own difference (its two runs back to back).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

import redis  # noqa: E402
from kvtier_redis import RedisBackend  # noqa: E402
from redis_server import RedisServer  # noqa: E402

from kvtier.config.units import parse_size  # noqa: E402

CAPACITY = 64 << 20
TENANTS = {"a": "32MiB", "b": "32MiB"}


def median_put_us(url: str, namespace: str, tenants: Any, puts: int, size: int) -> float:
    backend = RedisBackend()
    options: dict[str, Any] = {"url": url, "capacity": CAPACITY, "tenant": "a"}
    if tenants:
        options["tenants"] = tenants
    backend.kvtier_open(options, namespace)
    data = random.Random(1).randbytes(size)
    times = []
    try:
        for i in range(puts):
            start = time.perf_counter()
            stored = backend.kvtier_put([b"k%d" % i], [data], [])
            times.append(time.perf_counter() - start)
            assert stored == [True], f"put {i} was refused"
    finally:
        backend.kvtier_close()
    return statistics.median(times[puts // 3:]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--puts", type=int, default=3000)
    parser.add_argument("--block-size", default="64KiB")
    args = parser.parse_args()
    size = parse_size(args.block_size)
    if args.puts * size < 2 * CAPACITY:
        parser.error("puts x block size must be at least twice the 64 MiB capacity")
    without: list[float] = []
    with_tenants: list[float] = []
    with RedisServer(tempfile.mkdtemp(prefix="kvtier-bench-redis-")) as server:
        url = server.url(1)
        for repeat in range(args.repeat):
            runs = [(without, None), (with_tenants, TENANTS)]
            if repeat % 2:
                runs.reverse()
            for results, tenants in runs:
                with redis.Redis.from_url(url) as client:
                    client.flushdb()
                results.append(median_put_us(url, f"{repeat + 1:032x}", tenants, args.puts, size))
    paired = [w - o for o, w in zip(without, with_tenants)]
    print(f"{args.puts} puts of {args.block_size}, medians of the evicting puts (us per put):")
    print("without tenants:", " ".join(f"{t:.0f}" for t in without),
          f"median {statistics.median(without):.0f}")
    print("with tenants:   ", " ".join(f"{t:.0f}" for t in with_tenants),
          f"median {statistics.median(with_tenants):.0f}")
    print(f"paired difference: median {statistics.median(paired):+.0f} us")


if __name__ == "__main__":
    main()
