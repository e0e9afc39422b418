"""One vLLM ``AsyncLLM`` engine whose requests may carry ``kv_hints``, for
tests/contrib/test_vllm_keep_engine.py.

    python tests/support/vllm_keep_runner.py --model DIR --kvtier-config YAML
        --requests JSON [--tier-options JSON] [--pause]

``--requests`` is a list of phases, each a list of requests ``{"name", "prompt":
[token ids], "hints": [[action_type, action_version, payload], ...], "tenant"}``
(``hints`` and ``tenant`` optional); a request's ``tenant`` goes in
``kv_transfer_params["kvtier"]["tenant"]``, and a request with hints is sent
with a ``KvHintsEnvelope`` of those actions (``AsyncLLM.generate(...,
kv_hints=...)``, a way vLLM 0.32 takes them; ``LLM.generate`` takes none).
Between phases vLLM's caches are reset, its CPU tier too (the reset waits for
the kvtier tier's transfers), so a phase finds in the tier below only what
earlier phases stored there.  ``--tier-options`` are the ``secondary_tiers``
entry's options, added to what ``kv_transfer_config`` builds.

After each phase a ``KVTIER-RUNNER PHASE`` line holds that phase's results; with
``--pause`` the runner then waits for a line on stdin, so the test can look at
the store.  The last stdout line starting ``KVTIER-RUNNER RESULT`` holds the
phases' results: per request its output ids and ``num_cached_tokens``.  The
engine core runs in a process of its own, as ``AsyncLLM`` always runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

TAG = "KVTIER-RUNNER"


def emit(kind: str, payload: Any) -> None:
    sys.stdout.write(f"{TAG} {kind} {json.dumps(payload)}\n")
    sys.stdout.flush()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

    from kvtier.contrib.vllm import kv_transfer_config

    transfer = kv_transfer_config(args.kvtier_config)
    transfer["kv_connector_extra_config"]["secondary_tiers"][0].update(
        json.loads(args.tier_options))
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=args.model, skip_tokenizer_init=True, dtype="float32", max_model_len=1024,
        enforce_eager=True, seed=0, block_size=32, enable_prefix_caching=False,
        kv_transfer_config=KVTransferConfig(**transfer)))
    count = 0

    async def generate(prompt: list[int], hints: list[list[Any]], tenant: str | None = None,
                       max_tokens: int = 16) -> Any:
        nonlocal count
        count += 1
        envelope = None
        if hints:
            envelope = KvHintsEnvelope(protocol_version="1", message_id=f"m{count}", actions=[
                KvHintAction(action_id=f"a{count}-{i}", action_type=kind,
                             action_version=version, payload=payload)
                for i, (kind, version, payload) in enumerate(hints)])
        extra = None if tenant is None else {"kv_transfer_params": {"kvtier": {"tenant": tenant}}}
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                detokenize=False, extra_args=extra)
        final = None
        async for out in engine.generate(TokensPrompt(prompt_token_ids=prompt), params,
                                         f"r{count}", kv_hints=envelope):
            final = out
        return final

    result: dict[str, Any] = {"phases": []}
    try:
        for index, requests in enumerate(json.loads(args.requests)):
            if index:
                await engine.reset_prefix_cache(reset_connector=True)
            runs = []
            for request in requests:
                out = await generate(request["prompt"], request.get("hints") or [],
                                     request.get("tenant"))
                runs.append({"name": request["name"], "ids": list(out.outputs[0].token_ids),
                             "num_cached_tokens": out.num_cached_tokens or 0})
            # the reset drains the tier's stores; a short prompt (no full block) then
            # steps the engine once more, so marks made after the stores have run
            await engine.reset_prefix_cache(reset_connector=True)
            await generate([5, 6, 7], [], max_tokens=2)
            await asyncio.sleep(0.2)
            result["phases"].append(runs)
            emit("PHASE", runs)
            if args.pause:
                await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    finally:
        engine.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--kvtier-config", required=True)
    parser.add_argument("--requests", required=True, help="JSON: phases of requests")
    parser.add_argument("--tier-options", default="{}", help="JSON: secondary tier options")
    parser.add_argument("--pause", action="store_true", help="wait for stdin after a phase")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    emit("RESULT", asyncio.run(run(args)))


if __name__ == "__main__":
    main()
