"""One fresh vLLM engine process timing one long prompt, for the load decision's proof.

    python tests/support/vllm_slow_tier.py --model DIR --tokens N [--kvtier-config YAML]
        [--store] [--vocab V]

The engine (vLLM on the CPU, in this process) first generates a prompt
shorter than a block, so one-time start-up work is not timed (and no tier is
read before the timed prompt); then it generates
one token after the long prompt, with the top 5 logprobs, and times that
(time to first token).  With ``--store`` it then steps the engine until the
chain has taken the prompt's KV, so a later process finds all of it.

The last stdout line starting ``KVTIER-SLOW`` holds a JSON object: ``ttft_s``,
``token``, ``logprobs`` (token id -> logprob), ``cached_tokens`` (prompt
tokens vLLM did not compute) and, with a chain, ``tiers``: per tier name its
``hits``, ``bytes_in``, ``bytes_out``, ``probes``, ``read_backs``, ``kept_costs``,
``declined``, ``declined_tokens``, ``block_s`` (the fitted load time of a usual block)
and ``load_source`` (what measured the tier last).

:func:`run_engine` runs it in a fresh process; ``bench/vllm_slow_tier.py``
and ``tests/contrib/test_vllm_slow_tier.py`` use it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

TAG = "KVTIER-SLOW "


def prompt_ids(tokens: int, vocab: int) -> list[int]:
    """The long prompt, as token ids below ``vocab`` (the random model has no tokenizer)."""
    return [(i * 7919 + 13) % (vocab - 3) + 3 for i in range(tokens)]


def chain_yaml(path: Path, tier: dict[str, Any], policy: str, rate: float | None,
               ram: str = "256MiB") -> Path:
    """Write a chain of a host tier (vLLM's CPU tier takes its place) over ``tier``, with
    ``load_policy: policy`` and, given ``rate`` (seconds a token), a recompute model."""
    config: dict[str, Any] = {
        "chain": [{"name": "ram", "backend": "host", "capacity": ram}, tier],
        "load_policy": policy,
    }
    if rate is not None:
        config["recompute"] = f"{rate * 1e3:.6f}ms/token"
    path.write_text(yaml.safe_dump(config))
    return path


def child(args: argparse.Namespace) -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kv_transfer = None
    if args.kvtier_config:
        from kvtier.contrib.vllm import kv_transfer_config

        kv_transfer = KVTransferConfig(**kv_transfer_config(args.kvtier_config))
    llm = LLM(
        model=args.model, skip_tokenizer_init=True, dtype="float32",
        max_model_len=args.tokens + 64, enforce_eager=True, seed=0, block_size=32,
        enable_prefix_caching=False,  # a hit must come through the offloading path
        kv_transfer_config=kv_transfer,
    )
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False,
                         logprobs=5)
    # warm-up, shorter than a block: nothing stored or looked up, so a tier is
    # first measured by the timed prompt
    llm.generate([TokensPrompt(prompt_token_ids=[7] * 20)], one, use_tqdm=False)
    start = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt_ids(args.tokens, args.vocab))],
                       one, use_tqdm=False)[0]
    ttft = time.perf_counter() - start
    first = out.outputs[0]
    logprobs = {str(t): float(lp.logprob) for t, lp in (first.logprobs or [{}])[0].items()}
    result: dict[str, Any] = {"ttft_s": ttft, "token": first.token_ids[0],
                              "logprobs": logprobs, "cached_tokens": out.num_cached_tokens or 0}
    if kv_transfer is not None:
        from kvtier.contrib.vllm import live_tiers

        tier = next(iter(live_tiers()))
        if args.store:  # step the engine until the chain has taken the prompt's KV
            last, steady, deadline = -1, time.monotonic(), time.monotonic() + 120
            while time.monotonic() < deadline:
                llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7])], one, use_tqdm=False)
                written = sum(t["bytes_in"] for t in tier.chain_stats()["tiers"])
                if written != last or tier.has_pending_work():
                    last, steady = written, time.monotonic()
                elif time.monotonic() - steady > 1.0:
                    break
                time.sleep(0.05)
        result["tiers"] = {
            t["name"]: {**{k: t[k] for k in ("hits", "bytes_in", "bytes_out", "probes",
                                              "read_backs", "kept_costs", "declined",
                                              "declined_tokens")},
                        "block_s": t["load_cost"]["block_s"],
                        "load_source": t["load_cost"].get("source", "none")}
            for t in tier.chain_stats()["tiers"]
        }
        result["recompute"] = tier.chain_stats().get("recompute")  # where its model came from
    llm.llm_engine.engine_core.shutdown()
    print(TAG + json.dumps(result), flush=True)


def run_engine(model: str, tokens: int, config: Path | None = None, *, store: bool = False,
               vocab: int = 512, pythonpath: str | None = None,
               timeout: float = 900) -> dict[str, Any]:
    """:func:`child` in a fresh process (vLLM on the CPU, offline, telemetry off);
    ``pythonpath`` is put first on the child's path (where a plugin is installed)."""
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1")
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    command = [sys.executable, __file__, "--model", model, "--tokens", str(tokens),
               "--vocab", str(vocab)]
    if config is not None:
        command += ["--kvtier-config", str(config)]
    if store:
        command.append("--store")
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(TAG)]
    if proc.returncode or not lines:
        raise RuntimeError(f"engine process failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len(TAG):])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--kvtier-config")
    parser.add_argument("--store", action="store_true")
    child(parser.parse_args())


if __name__ == "__main__":
    main()
