"""How far ``eviction: adaptive`` falls behind the best fixed policy in hindsight.

    python bench/adaptive_gap.py [--traces DIR] [--seed N] [--only NAME,...]

Replays each trace with ``kvtier plan --policy lru --policy arc --policy
s3fifo --policy adaptive --no-belady --json`` at the capacities of
BENCHMARKS.md's tables and at 1, 2, 5, 10, 20, 30, 40 and 50% of the trace's
unique blocks, and prints per capacity the best of lru, arc and s3fifo, the
adaptive policy's prefix hit ratio and the gap in points (best minus
adaptive; negative: adaptive ahead), then how many capacities are within
1 point and the worst gap.  Traces: Mooncake's FAST'25 ``synthetic`` and
``conversation`` (``synthetic_trace.jsonl`` and ``conversation_trace.jsonl``
in ``--traces``; left out where absent) and the generated ``prompts``,
``scan``, ``documents`` and ``sessions`` (20,000 requests, ``--seed``).
Two traces replay at a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
from typing import Any

KVTIER = os.path.join(os.path.dirname(sys.executable), "kvtier")
SHARES = (0.01, 0.02, 0.05, 0.10, 0.20, 0.30, 0.40, 0.50)
FIXED = ("lru", "arc", "s3fifo")
#: Capacities (blocks) of BENCHMARKS.md's tables, beside the shares of unique blocks.
TABLE_CAPACITIES = {
    "synthetic": (500, 1000, 2000, 3000, 5000, 10000, 20000),
    "conversation": (1827, 3528, 6811, 13151, 25393, 49030),
    "prompts": (10, 40, 160),
    "scan": (20, 40),
    "documents": (244, 910),
    "sessions": (501, 967),
}


def plan(source: list[str], policies: tuple[str, ...], capacities: list[int]) -> dict[str, Any]:
    cmd = [KVTIER, "plan", *source, "--no-belady", "--json"]
    cmd += [arg for p in policies for arg in ("--policy", p)]
    cmd += [arg for c in capacities for arg in ("--capacity", str(c))]
    result: dict[str, Any] = json.loads(subprocess.run(cmd, capture_output=True, text=True,
                                                       check=True).stdout)
    return result


def gaps(name: str, source: list[str]) -> list[tuple[str, int, float, float]]:
    unique = plan(source, ("lru",), [1])["ceiling"]["puts"]  # every block put once
    capacities = sorted(set(TABLE_CAPACITIES[name]) | {max(1, int(unique * s)) for s in SHARES})
    curves = plan(source, (*FIXED, "adaptive"), capacities)["curves"]
    rows = []
    for i, capacity in enumerate(capacities):
        best = max(curves[p][i]["prefix_ratio"] for p in FIXED) * 100
        rows.append((name, capacity, best, curves["adaptive"][i]["prefix_ratio"] * 100))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=".", help="folder of Mooncake's trace files")
    parser.add_argument("--seed", type=int, default=1, help="of the generated traces")
    parser.add_argument("--only", help="comma-separated trace names")
    args = parser.parse_args()
    sources = {}
    for name in ("synthetic", "conversation"):
        path = os.path.join(args.traces, f"{name}_trace.jsonl")
        if os.path.exists(path):
            sources[name] = [path]
    for kind in ("prompts", "scan", "documents", "sessions"):
        sources[kind] = ["--generate", f"{kind}:20000:{args.seed}"]
    if args.only:
        sources = {n: s for n, s in sources.items() if n in args.only.split(",")}
    with concurrent.futures.ProcessPoolExecutor(2) as pool:
        rows = [row for found in pool.map(gaps, sources, sources.values()) for row in found]
    for name, capacity, best, adaptive in rows:
        gap = best - adaptive
        print(f"{name:<13} {capacity:>7,}  best fixed {best:5.1f}%  adaptive {adaptive:5.1f}%  "
              f"gap {gap:5.2f}{'  (over 1)' if gap > 1 else ''}")
    worst = max(best - adaptive for _, _, best, adaptive in rows)
    within = sum(best - adaptive <= 1 for _, _, best, adaptive in rows)
    print(f"within 1 point at {within} of {len(rows)} capacities; worst gap {worst:.2f}")


if __name__ == "__main__":
    main()
