"""Throughput of the ``redis`` backend with ``cluster: true`` beside redis-py's own cluster client.

    python bench/redis_cluster.py [--block-size 64KiB --block-size 1MiB] [--blocks 32] [--rounds 8]

Starts a 3-master + 3-replica cluster of Debian ``redis-server`` processes on
127.0.0.1 (the test fixture ``tests/support/redis_cluster.py``), then times,
in one run and on the same payloads:

* raw: redis-py's :class:`RedisCluster` ``mset_nonatomic`` / ``mget_nonatomic``
  (one pipeline per node, nodes one after the other) on keys hash-tagged
  over 16 tags, as the backend's 16 shards are: the ceiling of plain strings;
* kvtier: the backend's ``kvtier_put`` / ``kvtier_get`` with no capacity
  (a put is a Lua script per shard, a get an ``MGET`` per shard, the nodes'
  pipelines in parallel threads);
* kvtier+cap: the same with a capacity that never fills (a put also keeps
  the LRU index and byte count, a get also updates recency);
* chain: a one-tier chain over the backend (framing and checksums added).

Every block read back is compared with what was written.  Prints GB/s
(10^9 bytes per second) and each ratio to raw, round by round summed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from kvtier_redis import RedisBackend  # noqa: E402
from redis.cluster import RedisCluster  # noqa: E402
from redis_cluster import RedisClusterServer  # noqa: E402

import kvtier  # noqa: E402
from kvtier.config.units import parse_size  # noqa: E402

NS = "b" * 32
TAGS = 16


def timed(rounds: int, fn: Callable[[int], None]) -> float:
    """Seconds over ``rounds`` calls of ``fn(round)``, after one untimed call."""
    fn(-1)
    start = time.perf_counter()
    for r in range(rounds):
        fn(r)
    return time.perf_counter() - start


def check(got: Sequence[bytes | None], want: Sequence[bytes], what: str) -> None:
    if list(got) != list(want):
        wrong = sum(g != w for g, w in zip(got, want))
        raise SystemExit(f"{what}: {wrong} of {len(want)} blocks came back wrong or missing")


def bench_backend(
    cluster: RedisClusterServer,
    label: str,
    options: dict[str, str],
    keys: Callable[[str, int], list[bytes]],
    payload: list[bytes],
    rounds: int,
) -> tuple[str, float, float]:
    backend = RedisBackend()
    backend.kvtier_open({"url": cluster.url, "cluster": True, "prefix": label, **options}, NS)
    try:
        put_s = timed(rounds, lambda r: backend.kvtier_put(keys(label, r), payload, []) and None)
        get_s = timed(rounds, lambda r: check(backend.kvtier_get(keys(label, r)), payload, label))
    finally:
        backend.kvtier_close()
    return label, put_s, get_s


def bench_size(cluster: RedisClusterServer, size: int, blocks: int, rounds: int) -> list[str]:
    payload = [os.urandom(size) for _ in range(blocks)]
    total = size * blocks * rounds
    rows: list[tuple[str, float, float]] = []
    raw = RedisCluster.from_url(cluster.url)

    def raw_keys(r: int) -> list[bytes]:
        return [b"raw:{%d}:%d:%d:%d" % (i % TAGS, size, r, i) for i in range(blocks)]

    put_s = timed(rounds, lambda r: raw.mset_nonatomic(dict(zip(raw_keys(r), payload))))
    get_s = timed(rounds, lambda r: check(raw.mget_nonatomic(raw_keys(r)), payload, "raw"))
    rows.append(("raw", put_s, get_s))
    raw.close()

    def keys(tag: str, r: int) -> list[bytes]:
        return [b"%s:%d:%d:%d" % (tag.encode(), size, r, i) for i in range(blocks)]

    rows.append(bench_backend(cluster, "kvtier", {}, keys, payload, rounds))
    rows.append(bench_backend(cluster, "kvtier+cap", {"capacity": "64GiB"}, keys, payload, rounds))

    namespace = kvtier.Namespace("bench", dtype="bfloat16", tokens_per_block=32)
    with kvtier.open_chain({"chain": [cluster.tier(prefix="chain")]}, namespace=namespace) as chain:
        put_s = timed(rounds, lambda r: chain.put(keys("chain", r), payload) and None)
        get_s = timed(rounds, lambda r: check(chain.get_bytes(keys("chain", r)), payload, "chain"))
    rows.append(("chain", put_s, get_s))
    cluster.flush()

    raw_put, raw_get = rows[0][1], rows[0][2]
    lines = []
    for label, put_s, get_s in rows:
        lines.append(
            f"| {size // 1024} KiB | {label} | {total / put_s / 1e9:.3f} | {raw_put / put_s:.2f}x "
            f"| {total / get_s / 1e9:.3f} | {raw_get / get_s:.2f}x |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block-size", action="append", default=None)
    parser.add_argument("--blocks", type=int, default=32, help="blocks per batched call")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    sizes = [parse_size(s) for s in (args.block_size or ["64KiB", "1MiB"])]
    with (
        tempfile.TemporaryDirectory(prefix="kvtier-bench-cluster-") as tmp,
        RedisClusterServer(tmp) as cluster,
    ):
        print(f"{args.blocks} blocks per call, {args.rounds} timed rounds, "
              "3 masters + 3 replicas on 127.0.0.1; GB/s = 10^9 B/s\n")
        print("| block | client | put GB/s | put vs raw | get GB/s | get vs raw |")
        print("|---|---|---|---|---|---|")
        for size in sizes:
            for line in bench_size(cluster, size, args.blocks, args.rounds):
                print(line, flush=True)


if __name__ == "__main__":
    main()
