"""One vLLM engine serving requests of several tenants, for tests/contrib/test_vllm_tenants.py.

    python tests/support/vllm_tenant_runner.py --model DIR --requests JSON
        [--kvtier-config YAML] [--tier-options JSON]

``--requests`` is a list of phases, each a list of requests ``{"name",
"prompt": [token ids], "salt": str | null, "tenant": any | absent}``.  A
request's ``salt`` is vLLM's ``cache_salt``; its ``tenant``, when the key is
there, goes in ``kv_transfer_params["kvtier"]["tenant"]`` as given (a bad
name included).  Between phases vLLM's caches are reset, its CPU tier too,
so each phase finds in the kvtier tier below only what earlier phases stored
there.  ``--tier-options`` are the tier's tenant options
(``kv_transfer_config``'s keywords).

The last stdout line starting ``KVTIER-RUNNER RESULT`` holds a JSON object:
per request its output ids and ``num_cached_tokens``; at the end, per tenant
whose chain opened, its namespace and tier counters, the adapter's
counters (the engine runs in this process) and the bytes of one chunk
(``chunk_bytes``: one vLLM block's KV, a block file's payload).  With a
connector, ``pool`` holds per phase, once its stores are done, the shared
fs pool's ``tenant_*`` figures (``tenant_bytes.<tenant>`` and so on).
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


def pool_figures() -> dict[str, int]:
    """The ``tenant_*`` figures of the fs tiers' shared pool (every tenant of the root), as
    the opened tenants' chains report them; empty where no tier counts tenants."""
    from kvtier.contrib.vllm import live_tiers

    figures: dict[str, int] = {}
    for tier in live_tiers():
        for stats in tier.tenant_stats().values():
            for t in stats["tiers"]:
                for key, value in t.get("backend_stats", {}).items():
                    if key.startswith("tenant_"):
                        figures[key] = max(figures.get(key, 0), int(value))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--requests", required=True, help="JSON: phases of requests")
    parser.add_argument("--kvtier-config", help="kvtier YAML; none: no connector")
    parser.add_argument("--tier-options", default="{}", help="JSON: the tier's tenant options")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    phases: list[list[dict[str, Any]]] = json.loads(args.requests)

    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kv_transfer = None
    if args.kvtier_config:
        from kvtier.contrib.vllm import kv_transfer_config

        kv_transfer = KVTransferConfig(
            **kv_transfer_config(args.kvtier_config, **json.loads(args.tier_options)))
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype="float32", max_model_len=1024,
              enforce_eager=True, seed=0, block_size=32, enable_prefix_caching=False,
              kv_transfer_config=kv_transfer, disable_log_stats=False)

    def sampling(request: dict[str, Any], max_tokens: int = 16) -> Any:
        extra = None
        if "tenant" in request:
            extra = {"kv_transfer_params": {"kvtier": {"tenant": request["tenant"]}}}
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                              detokenize=False, extra_args=extra)

    def settle() -> None:
        # idle steps: finished transfers are reported before the caches are reset
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7])],
                         sampling({}, 2), use_tqdm=False)
            time.sleep(0.05)

    result: dict[str, Any] = {"phases": []}
    for index, requests in enumerate(phases):
        if index and kv_transfer is not None:
            llm.reset_prefix_cache(reset_connector=True)
        runs = []
        for request in requests:
            prompt = TokensPrompt(prompt_token_ids=request["prompt"])
            if request.get("salt"):
                prompt["cache_salt"] = request["salt"]
            out = llm.generate([prompt], sampling(request), use_tqdm=False)[0]
            runs.append({"name": request["name"], "ids": list(out.outputs[0].token_ids),
                         "num_cached_tokens": out.num_cached_tokens or 0})
        if kv_transfer is not None:
            settle()
            result.setdefault("pool", []).append(pool_figures())
        result["phases"].append(runs)
    if kv_transfer is not None:
        from kvtier.contrib.vllm import live_tiers

        (tier,) = live_tiers()
        result["tenants"] = {
            name: {"namespace": stats["namespace"],
                   "tiers": {t["name"]: {k: t[k] for k in ("hits", "misses", "puts")}
                             for t in stats["tiers"]}}
            for name, stats in tier.tenant_stats().items()
        }
        result["adapter"] = tier.adapter_stats()
        result["chunk_bytes"] = tier.config_info()["kvtier_chunk_bytes"]
    llm.llm_engine.engine_core.shutdown()
    emit("RESULT", result)


if __name__ == "__main__":
    main()
