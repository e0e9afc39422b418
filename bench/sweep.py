"""Throughput of every tier against block size, beside each raw ceiling: JSON and PNG charts.

    python bench/sweep.py [--sizes 64KiB,256KiB,1MiB,2MiB,4MiB,8MiB] [--rounds 6]
        [--backend host --backend fs ...] [--batch-bytes 32MiB] [--out bench/charts]

Runs the tier section of ``kvtier bench`` once per block size (batches of
about ``--batch-bytes``: 4 to 64 blocks per call), writes every run to
``OUT/sweep.json`` and draws ``OUT/throughput-<tier>.png`` (kvtier put and
get against the raw ceilings) and ``OUT/ratio.png`` (kvtier/raw for every
tier).  Needs ``pip install 'kvtier[bench]'`` (matplotlib) for the charts;
``--no-charts`` only writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvtier.config.units import parse_size
from kvtier.tierbench import BUILTIN, BenchSettings, Progress, machine, run_tiers

HERE = Path(__file__).resolve().parent


def _label(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def sweep(sizes: list[int], rounds: int, backends: tuple[str, ...],
          batch_bytes: int) -> dict[str, Any]:
    runs = []
    progress = Progress(0)
    try:
        for size in sizes:
            blocks = max(4, min(64, batch_bytes // size))
            settings = BenchSettings(block_size=size, blocks=blocks, rounds=rounds,
                                     backends=backends)
            runs.append({"block_size": size, "blocks": blocks,
                         **run_tiers(settings, progress)})
    finally:
        progress.close()
    return {"machine": machine(), "rounds": rounds, "argv": sys.argv[1:], "runs": runs}


def charts(report: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # (tier, op) -> {"kvtier": [(size, gbps)], raw name: [(size, gbps)]}
    lines: dict[tuple[str, str], dict[str, list[tuple[int, float]]]] = {}
    for run in report["runs"]:
        for row in run["results"]:
            series = lines.setdefault((row["tier"], row["op"]), {})
            series.setdefault("kvtier", []).append((row["block_size"], row["kvtier"]["gbps"]))
            for raw in row["raw"]:
                series.setdefault(raw["name"], []).append((row["block_size"], raw["gbps"]))
    written = []
    tiers = list(dict.fromkeys(tier for tier, _ in lines))
    sizes = sorted({run["block_size"] for run in report["runs"]})
    for tier in tiers:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
        for ax, op in zip(axes, ("put", "get")):
            for name, points in lines.get((tier, op), {}).items():
                xs, ys = zip(*sorted(points))
                ax.plot(xs, ys, marker="o", linestyle="-" if name == "kvtier" else "--",
                        label=name if name == "kvtier" else f"raw: {name}")
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes, [_label(s) for s in sizes])
            ax.set_title(f"{tier}: {op}")
            ax.set_xlabel("block size")
            ax.set_ylabel("GB/s (10^9 B/s)")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"{tier}: kvtier against the raw ceiling ({report['machine']['cpus']} CPUs)")
        fig.tight_layout()
        path = out / f"throughput-{tier}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, op in zip(axes, ("put", "get")):
        for tier in tiers:
            series = lines.get((tier, op), {})
            kv = dict(series.get("kvtier", []))
            raws = [name for name in series if name != "kvtier"]
            if not raws:
                continue
            # object: the ratio against one request at a time, as its target says
            base = dict(series[raws[0]])
            points = sorted((s, kv[s] / base[s]) for s in kv if base.get(s))
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o", label=f"{tier} / {raws[0]}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [_label(s) for s in sizes])
        ax.set_title(f"kvtier / raw: {op}")
        ax.set_xlabel("block size")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("ratio")
    fig.tight_layout()
    path = out / "ratio.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64KiB,256KiB,1MiB,2MiB,4MiB,8MiB")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--backend", action="append", choices=BUILTIN)
    parser.add_argument("--batch-bytes", default="32MiB")
    parser.add_argument("--out", type=Path, default=HERE / "charts")
    parser.add_argument("--no-charts", action="store_true")
    parser.add_argument("--from-json", type=Path, help="draw the charts of an earlier run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        report = json.loads(args.from_json.read_text())
    else:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
        report = sweep(sizes, args.rounds, tuple(args.backend or BUILTIN),
                       parse_size(args.batch_bytes))
        (args.out / "sweep.json").write_text(json.dumps(report, indent=1) + "\n")
    bad = [r for run in report["runs"] for r in run["results"] if not r["verified"]]
    if bad:
        print(f"{len(bad)} results read back different data", file=sys.stderr)
    if not args.no_charts:
        for path in charts(report, args.out):
            print(path)


if __name__ == "__main__":
    main()
