"""The CPU worker's copy of a hit into the engine's KV cache: one thread against two.

    python bench/host_copy.py [--mib 128] [--rows 64] [--rounds 9]

Copies ``--mib`` MiB, as ``--rows`` rows of one ``(rows, bytes)`` int8 tensor each
way round (``kvtier.contrib.vllm.parallel_copy.ParallelCopy``, the copy function
of ``kvtier.contrib.vllm.worker``), on one thread and on two, alternating which
goes first; the destination is touched before the first round, as an engine's
KV cache is.  Prints the median and range of each, in ms, and checks every copy
byte for byte.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvtier.contrib.vllm.parallel_copy import ParallelCopy
from kvtier.contrib.vllm.worker import _copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    row = (args.mib << 20) // args.rows
    src = torch.randint(-128, 127, (args.rows, row), dtype=torch.int8)
    dst = torch.ones(args.rows, row, dtype=torch.int8)
    copies = {f"{n} thread{'s' * (n > 1)}": ParallelCopy(_copy, threads=n) for n in (1, 2)}
    times: dict[str, list[float]] = {name: [] for name in copies}
    for r in range(args.rounds + 1):
        order = list(copies) if r % 2 else list(reversed(copies))
        for name in order:
            dst.fill_(1)
            start = time.perf_counter()
            copies[name]([(dst, src)])
            elapsed = time.perf_counter() - start
            assert torch.equal(dst, src), name
            if r:  # the first round warms up
                times[name].append(elapsed)
    print(f"{args.mib} MiB in {args.rows} rows, {args.rounds} rounds, ms:")
    for name, ts in times.items():
        print(f"  {name:<10} median {statistics.median(ts) * 1e3:6.1f}  "
              f"({min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f})")
    for copy in copies.values():
        copy.shutdown()


if __name__ == "__main__":
    main()
