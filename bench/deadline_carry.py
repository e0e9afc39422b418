"""What taking deadlines along costs a promotion-heavy loop (``kvtier.chain.carry``).

    python bench/deadline_carry.py [--blocks 512] [--block-size 16KiB] [--batch 16]
                                   [--rounds 5] [--mode none|all]

A chain of ``host`` over ``fs`` (a temporary directory under the shared pool,
written through, ``direct_io: false``) gets ``--blocks`` blocks; the host tier
holds an eighth of them, so nearly every read is a hit at fs, promoted into
host, evicting an older copy there.  A round reads every block once, in
batches of ``--batch``, and waits for the promotions (``flush``): wall time
and the process's CPU time per block read, medians over the rounds.

``--mode none`` sets no deadline (the common case: the chain still asks the
shared fs tier, ``kvtier_deadlines``, once per promotion batch); ``--mode
all`` gives every block a deadline an hour away, so every promotion also
sets it at host.  The code measured is whatever ``import kvtier`` finds, so
a run with ``PYTHONPATH`` pointing at another checkout measures that one
(there ``--mode all`` sets deadlines that copies do not take along).

``--parts`` times the carry's parts for one promotion batch instead, each the
best of 7 runs of 200 calls, in the caller's thread (so a busy machine moves
them less than the loop): the read at fs and the copy into host beside the
record's look-up, the fs tier's ``kvtier_deadlines`` and the host tier's
``kvtier_expire``, without deadlines and with one on every block.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtier import open_chain
from kvtier.chain.carry import asks, carry, learn
from kvtier.config.units import parse_size


def config(root: Path, blocks: int, size: int) -> dict[str, Any]:
    return {"chain": [
        {"name": "ram", "backend": "host", "capacity": max(size * 4, blocks * size // 8)},
        {"name": "disk", "backend": "fs", "url": f"file://{root}",
         "capacity": blocks * size * 4, "direct_io": False, "write": "through"}]}


def run(blocks: int, size: int, batch: int, rounds: int, mode: str) -> dict[str, Any]:
    keys = [b"carry-bench-%06d" % i for i in range(blocks)]
    payload = bytes(range(256)) * (size // 256)
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as root, \
            open_chain(config(Path(root), blocks, size), {"model": "carry-bench"}) as chain:
        for start in range(0, blocks, 64):
            chain.put(keys[start : start + 64], [payload] * len(keys[start : start + 64]))
        chain.flush()
        if mode == "all":
            assert all(chain.expire(keys, after=3600))
        for _ in range(rounds + 1):  # the first round warms up
            wall, cpu = time.perf_counter(), time.process_time()
            for start in range(0, blocks, batch):
                found = chain.get_bytes(keys[start : start + batch])
                assert all(f is not None for f in found)
            chain.flush()
            walls.append((time.perf_counter() - wall) / blocks)
            cpus.append((time.process_time() - cpu) / blocks)
        tiers = chain.stats()["tiers"]
    return {
        "mode": mode, "blocks": blocks, "block_size": size, "batch": batch,
        "wall_us_per_block": round(statistics.median(walls[1:]) * 1e6, 1),
        "cpu_us_per_block": round(statistics.median(cpus[1:]) * 1e6, 1),
        "promoted": tiers[0].get("promoted"),
        # the fs tier's kvtier_deadlines calls (none in a checkout without them)
        "asked": {op: {"count": h["count"], "mean_us": round(h["mean_s"] * 1e6, 1)}
                  for op, h in tiers[1]["latency"].items() if op == "deadlines"},
        "expire_at_host": {op: {"count": h["count"], "mean_us": round(h["mean_s"] * 1e6, 1)}
                           for op, h in tiers[0]["latency"].items() if op == "expire"},
    }


def best_us(call: Callable[[], object], calls: int = 200, runs: int = 7) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls)
    return round(min(times) * 1e6, 1)


def parts(blocks: int, size: int, batch: int) -> dict[str, float]:
    keys = [b"carry-bench-%06d" % i for i in range(blocks)]
    with tempfile.TemporaryDirectory() as root, \
            open_chain(config(Path(root), blocks, size), {"model": "carry-bench"}) as chain:
        chain.put(keys, [bytes(size)] * blocks)
        chain.flush()
        host, fs = chain.tiers
        record, some = chain._traffic.deadlines, keys[:batch]
        blobs = fs.get_blobs(some)
        out = {"read at fs": best_us(lambda: fs.get_blobs(some)),
               "copy into host": best_us(lambda: host.put_blobs(some, blobs, [])),
               "none: record": best_us(lambda: record.known(some)),
               "none: fs kvtier_deadlines": best_us(
                   lambda: learn(fs, some, None) if asks(record, fs) else None)}
        chain.expire(keys, after=3600)
        known = record.known(some)
        assert known is not None
        out.update({"all: record": best_us(lambda: record.known(some)),
                    "all: fs kvtier_deadlines": best_us(lambda: learn(fs, some, known)),
                    "all: host kvtier_expire": best_us(
                        lambda: carry(host, some, [True] * len(some), known))})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=512)
    parser.add_argument("--block-size", default="16KiB")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mode", choices=("none", "all"), default="none")
    parser.add_argument("--parts", action="store_true")
    args = parser.parse_args()
    if args.parts:
        print(json.dumps(parts(args.blocks, parse_size(args.block_size), args.batch)))
        return
    print(json.dumps(run(args.blocks, parse_size(args.block_size), args.batch, args.rounds,
                         args.mode)))


if __name__ == "__main__":
    main()
