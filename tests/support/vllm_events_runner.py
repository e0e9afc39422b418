"""A vLLM engine publishing its KV-cache events over ZeroMQ (tests/plan/test_vllm_events_engine.py).

    python tests/support/vllm_events_runner.py --model DIR --prompts JSON --endpoint EP --replay EP

Generates the prompts (token-id lists, in order) greedily one after the
other; a prompt whose name ends in ``+full`` asks vLLM to report the blocks
it reuses from its prefix cache too (``kv_cache_report_mode: full``).  Then
prints ``KVTIER-RUNNER DONE`` and reads one line from stdin before shutting
down, so the test can read the publisher's replay endpoint meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True, help="JSON: [[name, token ids], ...]")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--replay", required=True)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from vllm import LLM, SamplingParams
    from vllm.config import KVEventsConfig
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=args.model, skip_tokenizer_init=True, dtype="float32", max_model_len=1024,
        enforce_eager=True, seed=0, block_size=32, enable_prefix_caching=True,
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                        endpoint=args.endpoint,
                                        replay_endpoint=args.replay),
    )
    for name, ids in json.loads(args.prompts):
        extra = {"kv_cache_report_mode": "full"} if name.endswith("+full") else None
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True,
                                detokenize=False, extra_args=extra)
        llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
    sys.stdout.write("KVTIER-RUNNER DONE\n")
    sys.stdout.flush()
    sys.stdin.readline()
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
