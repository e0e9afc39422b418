"""What online sizing costs: ``kvtier bench`` of host and fs tiers with it on and off.

    python bench/sizing_overhead.py [REPEATS] [DIR]     # REPEATS 0: the sharper figures only

Each repeat runs ``kvtier bench --section tiers`` (16 x 2 MiB blocks a call,
8 rounds) on a chain of four tiers: host and fs (local, ``pool: false``,
in DIR, default a temporary directory), each with ``sizing_sample`` at its
default and at 0.  A capacity of 1 GiB raises the rate to 0.5 (256 blocks of
2 MiB at 1x): half the keys feed the miniatures, near the most they cost.
Repeats alternate which of each pair runs first, and the fs roots are
emptied between them.  Prints, per tier and operation, the median and range
over the repeats of GB/s with sizing and of the ratio on/off within a repeat
(the two ran seconds apart), and the load averages the repeats started at.
On a shared, loaded machine those ratios spread far wider than 2%, so two
sharper figures follow.  Interleaved: one process opens the four tiers as
one-tier chains and puts then gets 16 fresh 2 MiB blocks in each in turn,
batch after batch (and evicts them), so that on and off see the same
moments of the machine; it prints the median batch time of each (wall
clock, and the CPU time of the process, which waiting for a core does not
count), and the median and quartiles of the ratio on/off of each pair of
batches made one after the other.  The calls alone: the median time of ``Sizing.got`` and
``Sizing.stored`` for a batch of 16 fresh keys of 2 MiB.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

import kvtier
from kvtier.policies.sizing import Sizing

TIERS = {
    "host": "    backend: host\n    capacity: 1GiB\n",
    "fs": "    backend: fs\n    url: file://{root}/{name}\n    capacity: 1GiB\n    pool: false\n",
}


def config(root: Path, off_first: bool) -> str:
    lines = ["chain:"]
    for backend, body in TIERS.items():
        for on in (not off_first, off_first):
            name = f"{backend}-{'on' if on else 'off'}"
            lines.append(f"  - name: {name}\n" + body.format(root=root, name=name)
                         + ("" if on else "    sizing_sample: 0\n"))
    return "\n".join(lines)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    root = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp())
    interleaved(root)
    calls()
    gbps: dict[tuple[str, str], list[float]] = {}
    loads: list[float] = []
    for r in range(repeats):
        for old in root.glob("*-o*"):
            shutil.rmtree(old, ignore_errors=True)
        path = root / "chain.yaml"
        path.write_text(config(root, off_first=r % 2 == 1))
        out = subprocess.run([sys.executable, "-m", "kvtier.cli", "bench", "--config", str(path),
                              "--section", "tiers", "--json"], capture_output=True, text=True,
                             check=True).stdout
        (root / f"repeat-{r + 1}.json").write_text(out)
        report = json.loads(out)
        loads.append(report["machine"]["load_average"][0])
        for row in report["tiers"]["results"]:
            gbps.setdefault((row["tier"], row["op"]), []).append(row["kvtier"]["gbps"])
        print(f"repeat {r + 1}/{repeats}: load {loads[-1]}", file=sys.stderr)
    if not repeats:
        return
    print(f"{repeats} repeats, 1-minute load average at their start {min(loads)}-{max(loads)}")
    for (tier, op), values in sorted(gbps.items()):
        if not tier.endswith("-on"):
            continue
        off = gbps[(tier[:-3] + "-off", op)]
        ratios = [a / b for a, b in zip(values, off, strict=True)]
        print(f"{tier[:-3]:5} {op:13} on {statistics.median(values):.3f} GB/s "
              f"({min(values):.3f}-{max(values):.3f}), off {statistics.median(off):.3f} "
              f"({min(off):.3f}-{max(off):.3f}), on/off median {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})")


def interleaved(root: Path, rounds: int = 200) -> None:
    """Median batch times of put and get, each tier on and off in turn, batch by batch."""
    ns = kvtier.Namespace("sizing-overhead", dtype="bfloat16", tokens_per_block=32)
    blocks = [np.random.default_rng(i).integers(0, 255, 2 << 20, dtype=np.uint8)
              for i in range(16)]
    outs = [bytearray(2 << 20) for _ in range(16)]
    tiers = {
        "host": {"backend": "host", "capacity": "1GiB"},
        "fs": {"backend": "fs", "capacity": "1GiB", "pool": False},
    }
    times: dict[tuple[str, str, bool], list[float]] = {}
    with ExitStack() as stack:
        chains = {}
        for name, body in tiers.items():
            for on in (True, False):
                entry = {"name": name, **body, **({} if on else {"sizing_sample": 0})}
                if name == "fs":
                    entry["url"] = f"file://{root}/inter-{'on' if on else 'off'}"
                chains[name, on] = stack.enter_context(
                    kvtier.open_chain({"chain": [entry]}, namespace=ns))
        for r in range(rounds):
            for (name, on), chain in chains.items() if r % 2 else reversed(chains.items()):
                keys = [f"{r}-{on}-{i}".encode() for i in range(16)]
                start, cpu_start = time.perf_counter(), time.process_time()
                assert chain.put(keys, blocks) == [True] * 16
                middle, cpu_middle = time.perf_counter(), time.process_time()
                assert chain.get(keys, outs) == [True] * 16
                end, cpu_end = time.perf_counter(), time.process_time()
                chain.evict(keys)
                times.setdefault((name, "put", on), []).append(middle - start)
                times.setdefault((name, "get", on), []).append(end - middle)
                times.setdefault((name, "put cpu", on), []).append(cpu_middle - cpu_start)
                times.setdefault((name, "get cpu", on), []).append(cpu_end - cpu_middle)
    print(f"interleaved, {rounds} batches of 16 x 2 MiB each:")
    for name in tiers:
        for op in ("put", "get", "put cpu", "get cpu"):
            on = statistics.median(times[name, op, True])
            off = statistics.median(times[name, op, False])
            pairs = [a / b for a, b in zip(times[name, op, True], times[name, op, False],
                                           strict=True)]
            q1, q2, q3 = statistics.quantiles(pairs, n=4)
            print(f"  {name:5} {op}: on {on * 1e3:.2f} ms, off {off * 1e3:.2f} ms; "
                  f"on/off of the pairs: median {q2:.3f}, quartiles {q1:.3f}-{q3:.3f}")


def calls(batches: int = 2000) -> None:
    """Microseconds per batch of 16 keys in each Sizing call, at the rate a 1 GiB tier
    of 2 MiB blocks raises ``sizing_sample`` to (0.5)."""
    for recency in (True, False):
        sizing = Sizing()
        sizing.start(1 << 30, 0.01, recency=recency)
        times: dict[str, list[float]] = {"got": [], "stored": []}
        for b in range(batches):
            keys = [f"{b}-{i}".encode() for i in range(16)]
            start = time.perf_counter()
            sizing.got(keys)
            middle = time.perf_counter()
            sizing.stored(keys, [2 << 20] * 16)
            end = time.perf_counter()
            times["got"].append(middle - start)
            times["stored"].append(end - middle)
        print(f"{'lru (fs)' if recency else 'fifo (object)'}: sample "
              f"{sizing.stats()['sizing_sample']}, per batch of 16: got "
              f"{statistics.median(times['got']) * 1e6:.1f} us, stored "
              f"{statistics.median(times['stored']) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
