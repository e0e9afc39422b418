"""TTFT in vLLM behind a slow tier with no ``recompute`` in the YAML: the model is learned.

    python bench/vllm_learned_recompute.py [--tokens 2048] [--layers 8] [--hidden 1024]
        [--mbps 20] [--reps 3] [--no-always] [--workdir DIR] [--json OUT]

Builds a random Llama (fp32, no tokenizer; by default the shape of
``bench/vllm_ttft.py``'s: 128 MiB of KV for 2048 tokens), installs the test suite's sample
plugin (its ``sample-slow`` backend keeps blocks in a folder, declared
persistent here, and holds each get for a time proportional to its bytes),
then runs every engine in a fresh process (``tests/support/vllm_slow_tier.py``),
each timing one prompt after a warm-up shorter than a block:

* ``learn`` (once): a chain over the slow tier with no delay and no
  ``recompute`` entry computes the prompt, stores it, and learns the
  recompute rate from vLLM's own recompute (kept in the tier's catalog);
* per repetition, interleaved: ``none`` (no offloading), ``learned`` (the
  tier slowed to ``--mbps`` MB/s, still no ``recompute`` entry: a fresh
  process that reads the learned model) and ``always`` (the same tier,
  ``load_policy: always``; left out with ``--no-always``).

The table gives each mode's median TTFT and its ratio to ``none``'s; every
run's first token and top-5 logprobs must agree with ``none``'s first run
(the script exits 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench/ is not a package

from vllm_slow_runs import (  # noqa: E402
    SUPPORT,
    VOCAB,
    add_model_arguments,
    agrees,
    medians,
    prepare,
)

sys.path.insert(0, str(SUPPORT))

from vllm_slow_tier import chain_yaml, run_engine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser, layers=8, hidden=1024, head_dim=128, kv_heads=8)
    parser.add_argument("--mbps", type=float, default=20.0, help="the slow tier's MB/s")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-always", action="store_true", help="leave the always mode out")
    parser.add_argument("--workdir")
    parser.add_argument("--json", help="write every run's figures here")
    args = parser.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="vllm-learned-"))
    work.mkdir(parents=True, exist_ok=True)
    slow_dir = work / "slow"
    model, site = prepare(work, args)

    def engine(config: Path | None, store: bool = False) -> dict[str, Any]:
        return run_engine(str(model), args.tokens, config, store=store, vocab=VOCAB,
                          pythonpath=str(site), timeout=1800)

    slow = {"name": "slow", "backend": "sample-slow", "root": str(slow_dir), "persistent": True}
    learned = engine(chain_yaml(work / "learn.yaml", {**slow, "delay_per_mib": 0.0}, "cost",
                                None), store=True)
    mib = learned["tiers"]["slow"]["bytes_in"] / 2**20
    print(f"learn: {learned['ttft_s']:.3f} s, {mib:.1f} MiB of KV stored, recompute "
          f"{learned['recompute']['model']} ({learned['recompute']['source']}, "
          f"{learned['recompute']['samples']} samples)", flush=True)
    delay = 2**20 / (args.mbps * 1e6)  # seconds a MiB at --mbps MB/s
    modes: dict[str, Path | None] = {
        "none": None,
        "learned": chain_yaml(work / "learned.yaml", {**slow, "delay_per_mib": delay},
                              "cost", None),
        "always": chain_yaml(work / "always.yaml", {**slow, "delay_per_mib": delay},
                             "always", None),
    }
    if args.no_always:
        del modes["always"]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in modes}
    wrong = []
    for rep in range(args.reps):
        for name, config in modes.items():
            result = engine(config)
            runs[name].append(result)
            if runs["none"] and not agrees(result, runs["none"][0]):
                wrong.append(name)
            model_s = result.get("recompute", {}).get("model")
            print(f"rep {rep + 1}/{args.reps} {name:>8}: {result['ttft_s']:.3f} s, "
                  f"{result['cached_tokens']} tokens from kvtier, recompute {model_s}",
                  flush=True)

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
