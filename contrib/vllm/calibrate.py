"""``kvtier calibrate``: measure once how long vLLM takes to prefill prompts of a model.

    kvtier calibrate MODEL [--tokens 256,1024] [--repeat 3] [--dtype float32] [--json]

Runs vLLM in this process (prefix caching off, so every prompt is computed),
generates one token for prompts of random token ids of each length, takes
the median time per length, and prints the chain YAML's ``recompute`` entry
(a table by prompt length, :mod:`kvtier.config.load`) for the load decision
of :mod:`kvtier.chain.cost`.  One token's decode is part of each figure: it
is a small share of a prefill of hundreds of tokens.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from typing import Any, Literal

import click

__all__ = ["calibrate_command", "measure"]

#: The dtypes vLLM's ``LLM`` takes by name.
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
Dtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]


def measure(model: str, lengths: list[int], repeat: int, dtype: Dtype) -> dict[int, float]:
    """Median seconds to prefill each prompt length (plus one decoded token)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, skip_tokenizer_init=True, dtype=dtype, enforce_eager=True,
              enable_prefix_caching=False, max_model_len=max(lengths) + 16, seed=0)
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
    seconds = measure(model, lengths, repeat, dtype)
    if as_json:
        click.echo(json.dumps({"model": model, "engine": "vllm",
                               "prefill_s": {str(n): s for n, s in seconds.items()}}))
        return
    table = ", ".join(f"{n} tokens: {s * 1e3:.3g}ms" for n, s in seconds.items())
    click.echo(f"# vLLM prefill of {model}, median of {repeat}")
    click.echo(f"recompute: {{{table}}}")
