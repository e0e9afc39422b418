"""``make demo``: vLLM on the CPU serving a long prompt's KV cache from a kvtier chain.

    python -m kvtier.contrib.vllm.demo [--dir DIR] [--tokens 2048] [--layers 8]
        [--hidden 1024] [--s3-endpoint URL --s3-bucket NAME]

Builds a random Llama big enough that prefilling a long prompt takes seconds
on the CPU (kept under ``DIR/model``, ``demo-vllm/model`` by default, and built
again only when ``--layers`` or ``--hidden`` change), writes a chain
(``DIR/tiers.yaml``: host RAM, which sizes vLLM's own CPU tier, then an ``fs``
tier under ``DIR/kv``, emptied first so that the first run really misses, then
an ``object`` tier when an S3 endpoint and bucket are given, or
``KVTIER_DEMO_S3_ENDPOINT`` / ``KVTIER_DEMO_S3_BUCKET`` are set; credentials
come from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``), and turns it on
with the one ``kv_transfer_config`` that ``kvtier vllm-args`` prints.

Then it sends the same prompt in two separate engine processes: the first
computes it (a miss) and stores its KV down the chain; the second, a fresh
process with nothing in RAM, finds it in the chain.  It prints the time to
first token of both and how many prompt tokens each got from kvtier, what
each tier served the second process, and whether the first tokens agree; it
exits with status 1 when they differ or the second process got nothing from
the chain.  ``bench/vllm_ttft.py`` times the same prompt on the same engine
settings (:func:`prompt_ids`, :func:`engine_args`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvtier.config.units import format_size

# long lines and the table stay whole in logs and pipes
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 120)
TAG = "KVTIER-DEMO "
_SHAPE_FILE = "kvtier-demo-shape.json"


def _chain_yaml(kv_dir: Path, endpoint: str | None, bucket: str | None) -> str:
    lines = [
        "chain:",
        "  - name: ram  # becomes vLLM's CPU tier (no second RAM copy)",
        "    backend: host",
        "    capacity: 1GiB",
        "  - name: disk",
        "    backend: fs",
        f"    url: file://{kv_dir}",
        "    capacity: 8GiB",
        "    io_threads: 16",
    ]
    if endpoint and bucket:
        lines += [
            "  - name: s3",
            "    backend: object",
            f"    endpoint: {endpoint}",
            f"    bucket: {bucket}",
            "    prefix: kvtier-demo",
        ]
    return "\n".join(lines) + "\n"


def prompt_ids(tokens: int) -> list[int]:
    """The long prompt, as token ids (the random model has no tokenizer)."""
    return [(i * 7919 + 13) % 30000 + 3 for i in range(tokens)]


def engine_args(model: str, tokens: int) -> dict[str, Any]:
    """``LLM(...)`` settings for timing a prompt of ``tokens`` on the random model."""
    return {
        "model": model,
        "skip_tokenizer_init": True,
        "dtype": "float32",
        "max_model_len": tokens + 64,
        "enforce_eager": True,
        "seed": 0,
        "block_size": 32,
        "enable_prefix_caching": False,  # a hit must come through the offloading path
    }


def child(args: argparse.Namespace) -> None:
    """One engine process: time one prompt, let stores land, report figures."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    from . import kv_transfer_config, live_tiers

    started = time.perf_counter()
    llm = LLM(
        **engine_args(args.model, args.tokens),
        kv_transfer_config=KVTransferConfig(**kv_transfer_config(args.config)),
    )
    engine_s = time.perf_counter() - started
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    # one-time start-up work (kernels, allocations) is not part of the timing
    llm.generate([TokensPrompt(prompt_token_ids=[7] * 40)], one, use_tqdm=False)
    start = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt_ids(args.tokens))], one,
                       use_tqdm=False)[0]
    ttft = time.perf_counter() - start

    tier = next(iter(live_tiers()))
    # vLLM hands KV to the chain after the request; step the engine until the
    # chain has taken all of it, so the next process finds the whole prompt
    last, steady_since, deadline = -1, time.monotonic(), time.monotonic() + 120
    while time.monotonic() < deadline:
        llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7])], one, use_tqdm=False)
        written = sum(t["bytes_in"] for t in tier.chain_stats()["tiers"])
        if written != last or tier.has_pending_work():
            last, steady_since = written, time.monotonic()
        elif time.monotonic() - steady_since > 1.0:
            break
        time.sleep(0.05)
    tiers = [
        {k: t[k] for k in ("name", "backend", "hits", "misses", "bytes_in", "bytes_out",
                           "corrupt", "latency")}
        for t in tier.chain_stats()["tiers"]
    ]
    llm.llm_engine.engine_core.shutdown()
    print(TAG + json.dumps({
        "ttft_s": ttft, "engine_s": engine_s, "token": out.outputs[0].token_ids[0],
        "cached_tokens": out.num_cached_tokens or 0, "tiers": tiers,
    }), flush=True)


def _run_child(args: argparse.Namespace, config: Path, model: Path) -> dict[str, Any]:
    env = dict(
        os.environ,
        VLLM_TARGET_DEVICE="cpu",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",  # one process: starts in ~20 s
        VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
        VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
    )
    proc = subprocess.run(
        [sys.executable, "-m", __spec__.name if __spec__ else "kvtier.contrib.vllm.demo",
         "--child", "--config", str(config), "--model", str(model),
         "--tokens", str(args.tokens)],
        env=env, capture_output=True, text=True,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(TAG)]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"the vLLM engine process failed (exit code {proc.returncode})")
    result: dict[str, Any] = json.loads(lines[-1][len(TAG):])
    return result


def _model(work: Path, args: argparse.Namespace) -> Path:
    model = work / "model"
    heads = args.hidden // 128
    shape = {"layers": args.layers, "hidden": args.hidden, "head_dim": 128,
             "kv_heads": math.gcd(8, heads), "vocab": 32000}
    marker = model / _SHAPE_FILE
    if marker.exists() and json.loads(marker.read_text()) == shape:
        console.print(f"model: {model} (built before)")
        return model
    from .randmodel import build

    shutil.rmtree(model, ignore_errors=True)
    with console.status(f"building a random Llama ({args.layers} layers, hidden "
                        f"{args.hidden}, fp32) in {model} ..."):
        start = time.perf_counter()
        build(model, layers=args.layers, hidden=args.hidden,
              heads=heads, kv_heads=shape["kv_heads"],
              head_dim=shape["head_dim"], vocab=shape["vocab"],
              max_positions=max(4096, args.tokens + 64), init_range=0.02)
    marker.write_text(json.dumps(shape))
    console.print(f"model: built in {time.perf_counter() - start:.0f} s")
    return model


def _table(title: str, result: dict[str, Any]) -> Table:
    table = Table(title=title)
    for column in ("tier", "backend", "hits", "misses", "written", "served", "corrupt",
                   "get p50", "get p99"):
        table.add_column(column, justify="right")
    for tier in result["tiers"]:
        get = tier["latency"].get("get", {})
        table.add_row(
            tier["name"], tier["backend"], str(tier["hits"]), str(tier["misses"]),
            format_size(tier["bytes_in"]), format_size(tier["bytes_out"]),
            str(tier["corrupt"]),
            f"{get.get('p50_s', 0) * 1000:.1f} ms", f"{get.get('p99_s', 0) * 1000:.1f} ms",
        )
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvtier.contrib.vllm.demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="demo-vllm", help="model, chain config and KV files")
    parser.add_argument("--tokens", type=int, default=2048, help="prompt length")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--s3-endpoint", default=os.environ.get("KVTIER_DEMO_S3_ENDPOINT"))
    parser.add_argument("--s3-bucket", default=os.environ.get("KVTIER_DEMO_S3_BUCKET"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return
    if args.hidden % 128 or args.tokens < 64:
        parser.error("--hidden must be a multiple of 128 (head_dim) and --tokens >= 64")

    work = Path(args.dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = _model(work, args)
    kv_dir = work / "kv"
    shutil.rmtree(kv_dir, ignore_errors=True)  # the first run must really miss
    config = work / "tiers.yaml"
    config.write_text(_chain_yaml(kv_dir, args.s3_endpoint, args.s3_bucket))
    console.print(f"chain: {config}\n" + config.read_text().rstrip())

    runs: dict[str, dict[str, Any]] = {}
    for name, what in (("miss", "computes the prompt and stores its KV down the chain"),
                       ("hit", "a fresh process: nothing in RAM, KV from the chain")):
        with console.status(f"engine process {len(runs) + 1} of 2: {what} ..."):
            runs[name] = _run_child(args, config, model)
        console.print(f"run {len(runs)} ({name}): time to first token "
                      f"{runs[name]['ttft_s']:.3f} s, {runs[name]['cached_tokens']} of "
                      f"{args.tokens} prompt tokens from kvtier "
                      f"(engine start {runs[name]['engine_s']:.0f} s, not counted)")
    console.print(_table("second process: what each tier served", runs["hit"]))
    miss, hit = runs["miss"]["ttft_s"], runs["hit"]["ttft_s"]
    same = runs["miss"]["token"] == runs["hit"]["token"]
    console.print(f"time to first token: {miss:.2f} s computed, {hit:.2f} s from kvtier "
                  f"({miss / hit:.1f}x faster); first token identical: {same}",
                  style="bold green" if same and runs["hit"]["cached_tokens"] else "bold red")
    if not same or not runs["hit"]["cached_tokens"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
