"""Charts of the smaller sections of ``kvtier bench``: lookup cost and codec ratio and speed.

    python bench/micro_charts.py [--report bench/charts/kvtier-bench.json] [--out bench/charts]

Reads a report written by ``kvtier bench --json`` (the figures in
BENCHMARKS.md come from ``kvtier bench --json > bench/charts/kvtier-bench.json``)
and draws ``OUT/lookup.png`` (Chain.lookup time against the number of keys,
3 tiers) and ``OUT/codec.png`` (zstd ratio and encode/decode speed per level,
without and with byte shuffle).  Needs matplotlib (``pip install 'kvtier[bench]'``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def lookup_chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    keys = [r["keys"] for r in rows]
    ax.plot(keys, [r["min_ms"] for r in rows], marker="o", label="min")
    ax.plot(keys, [r["p50_ms"] for r in rows], marker="o", linestyle="--", label="median")
    ax.axhline(5.0, color="grey", linewidth=0.8, linestyle=":")
    ax.axvline(8000, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("keys per Chain.lookup call")
    ax.set_ylabel("ms per call")
    ax.set_title("lookup across 3 host tiers, every key in the last")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def codec_chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["data"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for metric, ax, label in zip(("ratio", "encode_gbps", "decode_gbps"), axes,
                                 ("raw / stored", "encode GB/s", "decode GB/s")):
        for data in datasets:
            for shuffle in (0, 2):
                sel = [r for r in rows if r["data"] == data and r["shuffle"] == shuffle
                       and r["codec"] == "zstd"]
                ax.plot([r["level"] for r in sel], [r[metric] for r in sel], marker="o",
                        linestyle="-" if shuffle else "--",
                        label=f"{data}, shuffle {shuffle}")
        ax.set_xlabel("zstd level")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("codec on KV blocks (through kvtier.block.framing, checksum included)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=HERE / "charts" / "kvtier-bench.json")
    parser.add_argument("--out", type=Path, default=HERE / "charts")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    report = json.loads(args.report.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    if report.get("lookup"):
        lookup_chart(report["lookup"], args.out / "lookup.png")
        print(args.out / "lookup.png")
    if report.get("codec"):
        codec_chart(report["codec"], args.out / "codec.png")
        print(args.out / "codec.png")


if __name__ == "__main__":
    main()
