"""What the slow-tier vLLM benchmarks share: the model and plugin they run, the output check,
the table of medians.

``bench/vllm_slow_tier.py`` and ``bench/vllm_learned_recompute.py`` run every
engine in a fresh process (``tests/support/vllm_slow_tier.py``) on a random
Llama, with the test suite's sample plugin installed beside it, and judge
each mode by its median TTFT against no offloading.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

SUPPORT = Path(__file__).resolve().parent.parent / "tests" / "support"
sys.path.insert(0, str(SUPPORT))  # the scripts import vllm_slow_tier from it too

from vllm_slow_tier import run_engine  # noqa: E402

VOCAB = 32000


class Engine(Protocol):
    def __call__(self, config: Path | None, store: bool = False) -> dict[str, Any]: ...


def add_common_arguments(parser: argparse.ArgumentParser, *, layers: int, hidden: int,
                         head_dim: int, kv_heads: int) -> None:
    """``--tokens``, the random model's shape (with each script's defaults), ``--reps``,
    ``--workdir`` and ``--json``."""
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--hidden", type=int, default=hidden)
    parser.add_argument("--head-dim", type=int, default=head_dim)
    parser.add_argument("--kv-heads", type=int, default=kv_heads)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workdir")
    parser.add_argument("--json", help="write every run's figures here")


def workdir(args: argparse.Namespace, prefix: str) -> Path:
    """``--workdir``, made where missing, or a new temporary folder."""
    work = Path(args.workdir or tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    return work


def prepare(work: Path, args: argparse.Namespace) -> tuple[Path, Path]:
    """The random model (``work/model``) and the sample plugin (``work/site``), each made only
    where an earlier run in ``work`` has not left it; their paths."""
    model, site = work / "model", work / "site"
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, str(SUPPORT / "make_tiny_llama.py"), str(model),
                        "--layers", str(args.layers), "--hidden", str(args.hidden),
                        "--heads", str(args.hidden // args.head_dim),
                        "--kv-heads", str(args.kv_heads), "--head-dim", str(args.head_dim),
                        "--vocab", str(VOCAB), "--init-range", "0.02"],
                       check=True, capture_output=True)
    if not site.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", "--target", str(site),
                        str(SUPPORT / "kvtier-sample-plugin")], check=True)
    return model, site


def engines(work: Path, args: argparse.Namespace) -> Engine:
    """``engine(config, store=False)``: one run of the prompt in a fresh engine process on the
    model and plugin :func:`prepare` makes in ``work``; no offloading where ``config`` is None."""
    model, site = prepare(work, args)

    def engine(config: Path | None, store: bool = False) -> dict[str, Any]:
        return run_engine(str(model), args.tokens, config, store=store, vocab=VOCAB,
                          pythonpath=str(site), timeout=1800)

    return engine


def agrees(run: dict[str, Any], reference: dict[str, Any]) -> bool:
    """The same first token as ``reference``'s and its top logprobs within 1e-3."""
    return run["token"] == reference["token"] and all(
        abs(run["logprobs"].get(t, -1e9) - lp) < 1e-3 for t, lp in reference["logprobs"].items()
    )


def interleave(engine: Engine, modes: dict[str, Path | None], reps: int, width: int,
               reference: dict[str, Any] | None = None,
               note: Callable[[dict[str, Any]], str] = lambda result: "",
               ) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """``reps`` repetitions of every mode in turn (``modes`` maps a name to its chain YAML, None
    for no offloading), each run printed with what ``note`` adds; every mode's runs, and the
    modes of the runs whose output differs from ``reference``'s (from ``none``'s first run's
    where ``reference`` is None)."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in modes}
    wrong = []
    for rep in range(reps):
        for name, config in modes.items():
            result = engine(config)
            runs[name].append(result)
            against = reference or (runs["none"][0] if runs["none"] else None)
            if against is not None and not agrees(result, against):
                wrong.append(name)
            print(f"rep {rep + 1}/{reps} {name:>{width}}: {result['ttft_s']:.3f} s, "
                  f"{result['cached_tokens']} tokens from kvtier{note(result)}", flush=True)
    return runs, wrong


def medians(runs: dict[str, list[dict[str, Any]]], width: int) -> dict[str, dict[str, Any]]:
    """Prints each mode's median TTFT, its ratio to ``none``'s, the tokens read from kvtier and
    the probes; returns the same a mode, every run's TTFT and tokens with them."""
    base = statistics.median(r["ttft_s"] for r in runs["none"])
    print(f"\n{'mode':>{width}} | median TTFT | vs none | tokens from kvtier | probes")
    table: dict[str, dict[str, Any]] = {}
    for name, results in runs.items():
        median = statistics.median(r["ttft_s"] for r in results)
        probes = sum(t["probes"] for t in results[0].get("tiers", {}).values())
        table[name] = {"ttft_s": [r["ttft_s"] for r in results], "median_s": median,
                       "ratio": median / base,
                       "cached_tokens": [r["cached_tokens"] for r in results]}
        print(f"{name:>{width}} | {median:9.3f} s | {median / base:6.2f}x | "
              f"{results[0]['cached_tokens']:>18} | {probes}")
    return table
