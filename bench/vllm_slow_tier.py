"""TTFT in vLLM against how slow a tier is: no offload, always load, kvtier's decision.

    python bench/vllm_slow_tier.py [--tokens 2048] [--layers 4] [--hidden 512]
        [--slowness 0.5,1,1.5,3] [--reps 3] [--workdir DIR] [--chart PNG] [--json OUT]

Builds a random Llama (fp32, no tokenizer), installs the test suite's sample
plugin (``tests/support/kvtier-sample-plugin``: its ``sample-slow`` backend
keeps blocks in a folder and holds each get for a time proportional to its
bytes), then runs every engine in a fresh process
(``tests/support/vllm_slow_tier.py``), each timing one prompt after a
warm-up shorter than a block:

* ``calibrate`` (3 processes): no offloading; their median TTFT over the
  prompt's tokens is the recompute rate the ``cost`` runs are configured
  with, as ``kvtier calibrate`` would give it, and the time the slowness
  levels are set against.
* ``store`` (once): stores the prompt down a chain whose lower tier is
  ``sample-slow`` (with no delay) and an ``fs`` tier.
* per repetition, interleaved: ``none`` (no offloading); ``fs always`` and
  ``fs cost`` (the fast tier, with each load policy); and for each slowness
  ``s`` (loading the prompt from the slow tier takes ``s`` times the
  calibrated recompute time) ``always`` and ``cost``.

The table gives each mode's median TTFT over the repetitions and its ratio
to ``none``'s median; every run's first token and top-5 logprobs must agree
with the calibration run's (the script exits 1 otherwise).  ``--chart`` draws
TTFT against slowness (needs matplotlib, the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

from vllm_slow_runs import add_common_arguments, engines, interleave, medians, workdir
from vllm_slow_tier import chain_yaml  # tests/support, on the path vllm_slow_runs puts it on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser, layers=4, hidden=512, head_dim=64, kv_heads=4)
    parser.add_argument("--slowness", default="0.5,1,1.5,3",
                        help="load time from the slow tier over the recompute time")
    parser.add_argument("--chart", help="PNG of TTFT against slowness")
    args = parser.parse_args()
    levels = [float(x) for x in args.slowness.split(",")]

    work = workdir(args, "vllm-slow-")
    engine = engines(work, args)

    slow_dir, fs_dir = work / "slow", work / "fs"
    calibration = [engine(None) for _ in range(3)]
    reference = calibration[0]
    recompute = statistics.median(r["ttft_s"] for r in calibration)
    rate = recompute / args.tokens
    runs_s = ", ".join(f"{r['ttft_s']:.3f}" for r in calibration)
    print(f"calibrated: {recompute:.3f} s for {args.tokens} tokens, median of {runs_s} "
          f"({rate * 1e3:.4f} ms/token)", flush=True)
    slow = {"name": "slow", "backend": "sample-slow", "root": str(slow_dir)}
    fs = {"name": "disk", "backend": "fs", "url": str(fs_dir)}
    stored = engine(chain_yaml(work / "store-slow.yaml", {**slow, "delay_per_mib": 0.0},
                               "always", None), store=True)
    engine(chain_yaml(work / "store-fs.yaml", fs, "always", None), store=True)
    mib = stored["tiers"]["slow"]["bytes_in"] / 2**20
    print(f"stored: {mib:.1f} MiB of KV in each tier", flush=True)

    modes: dict[str, Path | None] = {"none": None}
    for policy in ("always", "cost"):
        modes[f"fs {policy}"] = chain_yaml(work / f"fs-{policy}.yaml", fs, policy, rate)
    for level in levels:
        delay = level * recompute / mib
        for policy in ("always", "cost"):
            modes[f"{level:g}x {policy}"] = chain_yaml(
                work / f"slow-{level:g}-{policy}.yaml", {**slow, "delay_per_mib": delay},
                policy, rate)
    runs, wrong = interleave(engine, modes, args.reps, 12, reference)

    table = medians(runs, 12)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "tokens": args.tokens, "layers": args.layers, "hidden": args.hidden,
            "calibrated_s": recompute, "kv_mib": mib, "levels": levels,
            "modes": table}, indent=1))
    if args.chart:
        draw(Path(args.chart), levels, table, args.tokens)
    if wrong:
        raise SystemExit(f"outputs differ from the no-offload run in: {sorted(set(wrong))}")


def draw(path: Path, levels: list[float], table: dict[str, dict[str, Any]], tokens: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--chart needs matplotlib: pip install 'kvtier[bench]'") from None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    none = table["none"]["median_s"]
    ax.axhline(none, color="grey", linestyle="--", label="no offload")
    for policy, style in (("always", "o-"), ("cost", "s-")):
        label = "always load" if policy == "always" else "kvtier's decision (cost)"
        ax.plot(levels, [table[f"{lv:g}x {policy}"]["median_s"] for lv in levels], style,
                label=label)
    ax.set_xlabel("tier slowness: load time / recompute time")
    ax.set_ylabel("time to first token (s, median)")
    ax.set_title(f"vLLM on the CPU, {tokens}-token prompt, fresh processes")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
