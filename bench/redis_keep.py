"""The cost of kept blocks per put in the ``redis`` backend: a put with marks present vs none.

    python bench/redis_keep.py [--repeat 5] [--puts 3000] [--block-size 64KiB] [--marks 256]
                               [--capacity 64MiB] [--old DIR]

Starts Debian's ``redis-server`` on a free port of 127.0.0.1 (the test
fixture ``tests/support/redis_server.py``), then times one process putting
distinct blocks, one per put, through the backend as tenant ``a`` of a pool of
``--capacity`` with ``tenants`` (a and b, quotas of half of it each, a keep
budget of a quarter each), the writer's quota the bound, in turns, each run
in an emptied database and a process of its own:

* none: no block kept;
* kept: first ``--marks`` blocks put and kept (one ``kvtier_keep`` call,
  timed too), then the same puts: every eviction passes over the kept blocks;
* old (with ``--old DIR``, a directory holding another ``kvtier_redis``
  package, such as the one before marks): no block kept, that code.

The times are the medians of the puts after the first third of the run, of
which every one evicts one block, at the caller, and the server's own time
per put script over those puts (``INFO commandstats``, reset at the first
third), which the client's scheduling does not move, and the commands the
scripts ran per put (the work, which no load moves).  Every block put is
checked as stored, and every kept block as still there, byte for byte, at
the end.  Prints microseconds per put and the median of each repeat's paired
difference against ``none``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUPPORT = HERE.parent / "tests" / "support"



def run_one(url: str, namespace: str, puts: int, size: int, marks: int,
            capacity: int) -> dict[str, float]:
    """One run in this process: ``marks`` blocks kept first, then ``puts`` timed puts."""
    import redis
    from kvtier_redis import RedisBackend

    backend = RedisBackend()
    rule = {"quota": capacity // 2, "keep": capacity // 4}
    backend.kvtier_open({"url": url, "capacity": capacity, "tenant": "a",
                         "tenants": {"a": rule, "b": rule}}, namespace)
    out: dict[str, float] = {}
    try:
        kept = [b"kept-%d" % i for i in range(marks)]
        kept_blocks = [random.Random(i).randbytes(size) for i in range(marks)]
        if marks:
            assert backend.kvtier_put(kept, kept_blocks, []) == [True] * marks
            start = time.perf_counter()
            assert backend.kvtier_keep(kept, True) == [True] * marks, "a mark was refused"
            out["keep_us_per_block"] = (time.perf_counter() - start) / marks * 1e6
        data = random.Random(-1).randbytes(size)
        times = []
        server = redis.Redis.from_url(url)
        for i in range(puts):
            if i == puts // 3:  # the server's own time, of the evicting puts only
                server.config_resetstat()
            start = time.perf_counter()
            stored = backend.kvtier_put([b"k%d" % i], [data], [])
            times.append(time.perf_counter() - start)
            assert stored == [True], f"put {i} was refused"
        stats = server.info("commandstats")
        script = stats["cmdstat_evalsha"]
        assert script["calls"] == puts - puts // 3, script
        out["script_us"] = float(script["usec_per_call"])
        # the commands the scripts ran (Redis counts them too), per put: the work
        inner = sum(v["calls"] for k, v in stats.items()
                    if k not in ("cmdstat_evalsha", "cmdstat_info", "cmdstat_config"))
        out["commands"] = inner / script["calls"]
        server.close()
        if marks:
            assert backend.kvtier_get(kept) == kept_blocks, "a kept block left"
        out["put_us"] = statistics.median(times[puts // 3:]) * 1e6
    finally:
        backend.kvtier_close()
    return out


def spawn(kind: str, url: str, namespace: str, args: argparse.Namespace) -> dict[str, float]:
    """``run_one`` in a fresh process, on the old code's package for ``old``."""
    env = dict(os.environ)
    if kind == "old":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.old, env.get("PYTHONPATH")]))
    marks = args.marks if kind == "kept" else 0
    spec = json.dumps([url, namespace, args.puts, args.size, marks, args.capacity])
    done = subprocess.run([sys.executable, __file__, "--child", spec], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the {kind} run failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--puts", type=int, default=3000)
    parser.add_argument("--block-size", default="64KiB")
    parser.add_argument("--marks", type=int, default=256)
    parser.add_argument("--capacity", default="64MiB")
    parser.add_argument("--old", default=None, help="a directory with another kvtier_redis")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(run_one(*json.loads(args.child))))
        return
    sys.path.insert(0, str(SUPPORT))
    import redis
    from redis_server import RedisServer

    from kvtier.config.units import parse_size

    args.size = parse_size(args.block_size)
    args.capacity = parse_size(args.capacity)
    if args.puts * args.size < 2 * args.capacity:
        parser.error("puts x block size must be at least twice the capacity")
    if args.marks * args.size > args.capacity // 4:
        parser.error("marks x block size must be within the keep budget, capacity / 4")
    kinds = ["none", "kept"] + (["old"] if args.old else [])
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    with RedisServer(Path(tempfile.mkdtemp(prefix="kvtier-bench-redis-"))) as server:
        url = server.url(1)
        for repeat in range(args.repeat):
            order = kinds[repeat % len(kinds):] + kinds[:repeat % len(kinds)]
            for kind in order:
                with redis.Redis.from_url(url) as client:
                    client.flushdb()
                results[kind].append(spawn(kind, url, f"{repeat + 1:032x}", args))
    print(f"{args.puts} puts of {args.block_size} into {args.capacity} bytes, {args.marks} "
          "blocks kept in 'kept'; medians of the evicting puts (us per put):")
    for figure, what in (("put_us", "put, at the caller"),
                         ("script_us", "put script, on the server (mean)")):
        print(f"{what}:")
        none = [r[figure] for r in results["none"]]
        for kind in kinds:
            puts = [r[figure] for r in results[kind]]
            line = f"  {kind:5} " + " ".join(f"{t:.0f}" for t in puts)
            line += f"  median {statistics.median(puts):.0f}"
            if kind != "none":
                paired = [p - n for p, n in zip(puts, none)]
                line += f"  paired difference {statistics.median(paired):+.0f}"
            print(line)
    for kind in kinds:
        commands = [r["commands"] for r in results[kind]]
        print(f"  {kind:5} Redis commands per put script:",
              " ".join(f"{c:.2f}" for c in commands))
    keeps = [r["keep_us_per_block"] for r in results["kept"]]
    print(f"kvtier_keep of {args.marks} blocks in one call: "
          f"median {statistics.median(keeps):.1f} us per block")


if __name__ == "__main__":
    main()
