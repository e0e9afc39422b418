"""Markdown tables from the JSON that ``kvtier bench --json`` and ``bench/sweep.py`` write.

    python bench/report.py [--report bench/charts/kvtier-bench.json]
        [--sweep bench/charts/sweep.json] [--compare OTHER.json ...]

The tables in BENCHMARKS.md are this script's output, so every figure there
comes from a file a command in the repository wrote.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def tiers_table(report: dict[str, Any]) -> str:
    s = report["settings"]
    out = [f"Batches of {s['blocks']} x {_size(s['block_size'])}, {s['rounds']} timed rounds "
           "(after one untimed), GB/s = 10^9 B/s, latency per batched call; kvtier/raw "
           "divides throughputs over all rounds, *median batches* divides the median batch "
           "times (robust to one disturbed round).", "",
           "| tier | op | kvtier GB/s | p50 ms | p99 ms | raw ceiling | raw GB/s | raw p50 ms "
           "| raw p99 ms | kvtier/raw | median batches | verified |",
           "|---|---|--:|--:|--:|---|--:|--:|--:|--:|--:|---|"]
    for row in report["tiers"]["results"]:
        kv = row["kvtier"]
        for i, raw in enumerate(row["raw"] or [None]):
            head = (f"| {row['tier']} ({row['backend']}) | {row['op']} | {kv['gbps']:.3f} | "
                    f"{kv['p50_ms']:.2f} | {kv['p99_ms']:.2f} |" if i == 0 else "| | | | | |")
            if raw is None:
                out.append(f"{head} {row.get('note', '-')} | - | - | - | - | - | "
                           f"{'yes' if row['verified'] else 'NO'} |")
            else:
                out.append(f"{head} {raw['name']} | {raw['gbps']:.3f} | {raw['p50_ms']:.2f} | "
                           f"{raw['p99_ms']:.2f} | {_ratio(raw['ratio'])} | "
                           f"{_ratio(raw.get('ratio_p50'))} | "
                           f"{('yes' if row['verified'] else 'NO') if i == 0 else ''} |")
    return "\n".join(out)


def dispatch_table(d: dict[str, Any]) -> str:
    lines = [
        "| measure | value |", "|---|--:|",
        f"| lookup of {d['batch']} keys through pluggy | {d['lookup_hook_us']:.2f} us |",
        f"| the same, calling `kvtier_lookup` directly | {d['lookup_direct_us']:.2f} us |",
        f"| dispatch overhead per batched call | {d['overhead_per_call_us']:.2f} us |",
        f"| get_into of {d['batch']} x {_size(d['block_size'])} through pluggy "
        f"| {d['get_into_hook_ms']:.3f} ms |",
        f"| the same, direct | {d['get_into_direct_ms']:.3f} ms |",
        f"| one {_size(d['block_size'])} get_into, cache-hot, direct "
        f"| {d['one_block_get_into_us']:.0f} us |",
        f"| overhead / one cache-hot block | {d['overhead_vs_one_block_pct']:.2f}% |",
    ]
    if "host_get_per_block_us" in d:
        lines.append(f"| overhead / one block of the host tier's get (tier table, p50) "
                     f"| {d['overhead_vs_host_get_block_pct']:.2f}% |")
    lines.append(f"| overhead / the batched get_into | {d['overhead_vs_batch_pct']:.3f}% |")
    return "\n".join(lines)


def lookup_table(rows: list[dict[str, Any]]) -> str:
    out = ["| keys | min ms | median ms | us per key (min) | calls timed |",
           "|--:|--:|--:|--:|--:|"]
    for r in rows:
        out.append(f"| {r['keys']:,} | {r['min_ms']:.2f} | {r['p50_ms']:.2f} | "
                   f"{r['us_per_key']:.3f} | {r['repeats']} |")
    return "\n".join(out)


def codec_table(rows: list[dict[str, Any]]) -> str:
    out = ["| data | codec | level | shuffle | raw/stored | encode GB/s | decode GB/s |",
           "|---|---|--:|--:|--:|--:|--:|"]
    for r in rows:
        level = r["level"] if r.get("codec", "zstd") == "zstd" else "-"
        out.append(f"| {r['data']} | {r.get('codec', 'zstd')} | {level} | {r['shuffle']} | "
                   f"{r['ratio']:.3f} | "
                   f"{r['encode_gbps']:.3f} | {r['decode_gbps']:.3f} |")
    return "\n".join(out)


def sweep_table(sweep: dict[str, Any]) -> str:
    runs = sweep["runs"]
    sizes = [run["block_size"] for run in runs]
    out = ["kvtier GB/s / raw GB/s (ratio) per block size; blocks per call: "
           + ", ".join(f"{_size(r['block_size'])}: {r['blocks']}" for r in runs) + ".", "",
           "| tier | op | raw | " + " | ".join(_size(s) for s in sizes) + " |",
           "|---|---|---|" + "--:|" * len(sizes)]
    cells: dict[tuple[str, str, str], dict[int, str]] = {}
    for run in runs:
        for row in run["results"]:
            for raw in row["raw"]:
                cells.setdefault((row["tier"], row["op"], raw["name"]), {})[run["block_size"]] = (
                    f"{row['kvtier']['gbps']:.2f} / {raw['gbps']:.2f} ({_ratio(raw['ratio'])})")
    for (tier, op, raw), by_size in cells.items():
        out.append(f"| {tier} | {op} | {raw} | "
                   + " | ".join(by_size.get(s, "-") for s in sizes) + " |")
    return "\n".join(out)


def compare_table(reports: list[tuple[str, dict[str, Any]]]) -> str:
    """kvtier/raw of every tier, op and ceiling, one column per run."""
    head = " | ".join(f"{name} (load {r['machine']['load_average'][0]})" for name, r in reports)
    out = [f"| tier | op | raw | {head} |", "|---|---|---|" + "--:|" * len(reports)]
    cells: dict[tuple[str, str, str], list[str]] = {}
    for n, (_, report) in enumerate(reports):
        for row in report["tiers"]["results"]:
            for raw in row["raw"]:
                cell = cells.setdefault((row["tier"], row["op"], raw["name"]), ["-"] * len(reports))
                cell[n] = f"{_ratio(raw['ratio'])} ({_ratio(raw.get('ratio_p50'))})"
    for (tier, op, raw), values in cells.items():
        out.append(f"| {tier} | {op} | {raw} | " + " | ".join(values) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=HERE / "charts" / "kvtier-bench.json")
    parser.add_argument("--sweep", type=Path, default=HERE / "charts" / "sweep.json")
    parser.add_argument("--compare", type=Path, nargs="*", default=[],
                        help="more reports: a table of kvtier/raw per run")
    args = parser.parse_args()
    if args.compare:
        runs = [(p.name, json.loads(p.read_text())) for p in [args.report, *args.compare]]
        print("### kvtier/raw across runs (median batches in brackets)\n\n"
              + compare_table(runs) + "\n")
        return
    if args.report.exists():
        report = json.loads(args.report.read_text())
        m = report["machine"]
        print(f"Machine: {m['cpus']} CPUs ({m['cpu']}), Python {m['python']}, {m['platform']}; "
              f"load average {m['load_average']} when the run began ({m['time']}).\n")
        if report.get("tiers"):
            print("### Tiers\n\n" + tiers_table(report) + "\n")
            for note in report["tiers"]["notes"]:
                print(f"Note: {note}.\n")
        if report.get("dispatch"):
            print("### pluggy dispatch\n\n" + dispatch_table(report["dispatch"]) + "\n")
        if report.get("lookup"):
            print("### Lookup\n\n" + lookup_table(report["lookup"]) + "\n")
        if report.get("codec"):
            print("### Codec\n\n" + codec_table(report["codec"]) + "\n")
    if args.sweep.exists():
        print("### Block size sweep\n\n" + sweep_table(json.loads(args.sweep.read_text())) + "\n")


if __name__ == "__main__":
    main()
