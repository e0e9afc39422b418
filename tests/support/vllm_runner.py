"""One vLLM engine run for tests/contrib/test_vllm_engine.py, in a process of its own.

    python tests/support/vllm_runner.py --model DIR --prompts JSON [--kvtier-config YAML]
        [--phases 'p1,p2;p1'] [--pause] [--reset-between] [--max-tokens 16]

Prompts are token-id lists by name.  Each phase (``;``-separated) generates
its comma-separated prompts one after the other, greedily.  Between phases
the runner can reset vLLM's caches including the CPU tier
(``--reset-between``) and wait for the test (``--pause``: it prints
``KVTIER-RUNNER PAUSED <n>`` and reads one line from stdin), so a test can
change the world (damage blocks, stop a server) in the middle of a run.

The last stdout line starting ``KVTIER-RUNNER RESULT`` holds a JSON object:
per generation its output token ids and ``num_cached_tokens``; after each
phase the kvtier figures vLLM reported through its metrics
(``vllm:kv_offload_kvtier_*`` from ``LLM.get_metrics()``), and, when the
engine runs in this process, the chain's own ``stats()`` and the adapter's
counters read from the live tier.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

TAG = "KVTIER-RUNNER"


def emit(kind: str, payload: Any) -> None:
    sys.stdout.write(f"{TAG} {kind} {json.dumps(payload)}\n")
    sys.stdout.flush()


def kvtier_metrics(llm: Any) -> dict[str, float]:
    """Cumulative ``vllm:kv_offload_kvtier_*`` values, ``name{label}`` -> value."""
    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        if not metric.name.startswith("vllm:kv_offload_kvtier_"):
            continue
        labels = {k: v for k, v in metric.labels.items()
                  if k in ("kvtier_tier", "result", "outcome", "reason", "kind", "source")}
        label = ",".join(f"{v}" for _, v in sorted(labels.items()))
        value = getattr(metric, "value", None)
        if isinstance(value, (int, float)):
            out[f"{metric.name.removeprefix('vllm:kv_offload_kvtier_')}{{{label}}}"] = value
    return out


def local_stats() -> list[dict[str, Any]] | None:
    """Chain and adapter figures of the tiers living in this process (single-process mode)."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        return None
    from kvtier.contrib.vllm import live_tiers

    return [
        {
            "namespace": tier.namespace.hex,
            "chain": {
                t["name"]: {k: t[k] for k in ("hits", "misses", "corrupt", "errors", "puts",
                                              "bytes_in", "bytes_out", "healthy", "probes",
                                              "declined", "declined_tokens", "kept_costs",
                                              "read_backs", "read_back_failures")}
                for t in tier.chain_stats()["tiers"]
            },
            "recompute": tier.chain_stats()["recompute"],  # the load decision's model
            "adapter": tier.adapter_stats(),
        }
        for tier in live_tiers()
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True, help="JSON: name -> token ids")
    parser.add_argument("--kvtier-config", help="kvtier YAML; none: no connector")
    parser.add_argument("--phases", default="", help="'a,b;a' (default: every prompt once)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--pause", action="store_true")
    parser.add_argument("--reset-between", action="store_true")
    parser.add_argument("--kv-events", action="store_true",
                        help="switch vLLM's KV cache events on (null publisher)")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds of idle engine steps after each phase")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    prompts: dict[str, list[int]] = json.loads(args.prompts)
    phases = [p.split(",") for p in args.phases.split(";")] if args.phases else [list(prompts)]

    started = time.monotonic()
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kv_transfer = None
    if args.kvtier_config:
        from kvtier.contrib.vllm import kv_transfer_config

        kv_transfer = KVTransferConfig(**kv_transfer_config(args.kvtier_config))
    extra: dict[str, Any] = {}
    if args.kv_events:
        from vllm.config import KVEventsConfig

        extra["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    llm = LLM(
        model=args.model,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
        seed=0,
        block_size=32,
        enable_prefix_caching=False,
        kv_transfer_config=kv_transfer,
        disable_log_stats=False,
        **extra,
    )
    engine_s = time.monotonic() - started
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True,
                            detokenize=False)
    idle = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, detokenize=False)

    def settle() -> None:
        # engine steps with nothing to offload, so finished transfers are
        # reported and stats flow out; a sub-block prompt offloads nothing
        deadline = time.monotonic() + args.settle
        while time.monotonic() < deadline:
            llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7])], idle, use_tqdm=False)
            time.sleep(0.05)

    result: dict[str, Any] = {"engine_s": round(engine_s, 1), "phases": []}
    for index, names in enumerate(phases):
        if index:
            if args.pause:
                emit("PAUSED", index)
                if not sys.stdin.readline():
                    raise SystemExit("stdin closed while paused")
            if args.reset_between:
                llm.reset_prefix_cache(reset_connector=True)
        runs = []
        for name in names:
            t0 = time.monotonic()
            out = llm.generate([TokensPrompt(prompt_token_ids=prompts[name])], greedy,
                               use_tqdm=False)[0]
            runs.append({
                "prompt": name,
                "ids": list(out.outputs[0].token_ids),
                "num_cached_tokens": out.num_cached_tokens or 0,
                "s": round(time.monotonic() - t0, 3),
            })
        if kv_transfer is not None:
            settle()
        phase: dict[str, Any] = {"runs": runs}
        if kv_transfer is not None:
            phase["metrics"] = kvtier_metrics(llm)
            phase["local"] = local_stats()
        result["phases"].append(phase)
        emit("PHASE", index)
    llm.llm_engine.engine_core.shutdown()
    emit("RESULT", result)


if __name__ == "__main__":
    main()
