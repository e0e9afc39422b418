"""TTFT in vLLM behind a slow tier with no ``recompute`` in the YAML: the model is learned.

    python bench/vllm_learned_recompute.py [--tokens 2048] [--layers 8] [--hidden 1024]
        [--mbps 20] [--reps 3] [--no-always] [--workdir DIR] [--json OUT]

Builds a random Llama (fp32, no tokenizer; by default the shape of
``bench/vllm_ttft.py``'s: 128 MiB of KV for 2048 tokens), installs the test suite's sample
plugin (its ``sample-slow`` backend keeps blocks in a folder, declared
persistent here, and holds each get for a time proportional to its bytes),
then runs every engine in a fresh process (``tests/support/vllm_slow_tier.py``),
each timing one prompt after a warm-up shorter than a block:

* ``learn`` (once): a chain over the slow tier (slowed to ``--mbps``
  MB/s) with no ``recompute`` entry computes the prompt, stores it, learns
  the recompute rate from vLLM's own recompute, and reads back two of the
  blocks it stored once its stores stop: it keeps both in the tier's
  catalog;
* per repetition, interleaved: ``none`` (no offloading), ``learned`` (the
  tier slowed to ``--mbps`` MB/s, still no ``recompute`` entry: a fresh
  process that reads the learned model) and ``always`` (the same tier,
  ``load_policy: always``; left out with ``--no-always``).

Each run prints the slow tier's probes (blocks read only to measure it) and
kept costs (times the fit an earlier process kept judged it instead): the
first ``learned`` process after ``learn`` declines the tier by the load cost
``learn`` read back, without a probe or any read.

The table gives each mode's median TTFT and its ratio to ``none``'s; every
run's first token and top-5 logprobs must agree with ``none``'s first run
(the script exits 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

from vllm_slow_runs import add_common_arguments, engines, interleave, medians, workdir
from vllm_slow_tier import chain_yaml  # tests/support, on the path vllm_slow_runs puts it on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser, layers=8, hidden=1024, head_dim=128, kv_heads=8)
    parser.add_argument("--mbps", type=float, default=20.0, help="the slow tier's MB/s")
    parser.add_argument("--no-always", action="store_true", help="leave the always mode out")
    args = parser.parse_args()

    work = workdir(args, "vllm-learned-")
    slow_dir = work / "slow"
    engine = engines(work, args)

    delay = 2**20 / (args.mbps * 1e6)  # seconds a MiB at --mbps MB/s
    slow = {"name": "slow", "backend": "sample-slow", "root": str(slow_dir), "persistent": True}
    learned = engine(chain_yaml(work / "learn.yaml", {**slow, "delay_per_mib": delay}, "cost",
                                None), store=True)
    mib = learned["tiers"]["slow"]["bytes_in"] / 2**20
    print(f"learn: {learned['ttft_s']:.3f} s, {mib:.1f} MiB of KV stored, recompute "
          f"{learned['recompute']['model']} ({learned['recompute']['source']}, "
          f"{learned['recompute']['samples']} samples), the slow tier "
          f"{learned['tiers']['slow']['block_s']:.3f} s a block "
          f"({learned['tiers']['slow']['load_source']}, kept at close)", flush=True)
    modes: dict[str, Path | None] = {
        "none": None,
        "learned": chain_yaml(work / "learned.yaml", {**slow, "delay_per_mib": delay},
                              "cost", None),
        "always": chain_yaml(work / "always.yaml", {**slow, "delay_per_mib": delay},
                             "always", None),
    }
    if args.no_always:
        del modes["always"]
    runs, wrong = interleave(
        engine, modes, args.reps, 8,
        note=lambda result: f", recompute {result.get('recompute', {}).get('model')}" + "".join(
            f", {name}: {t['probes']} probes, {t['kept_costs']} kept costs"
            for name, t in result.get("tiers", {}).items()))

    table = medians(runs, 8)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "tokens": args.tokens, "layers": args.layers, "hidden": args.hidden,
            "mbps": args.mbps, "kv_mib": mib, "learned": learned["recompute"],
            "modes": table}, indent=1))
    if wrong:
        raise SystemExit(f"outputs differ from the no-offload run in: {sorted(set(wrong))}")


if __name__ == "__main__":
    main()
