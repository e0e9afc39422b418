"""Random Llama checkpoints for demos, benchmarks and tests (no hub access).

vLLM needs a model on disk; a random one of a chosen shape is enough to make
prefill cost what a real model of that shape costs, and greedy decoding of
random weights is deterministic, so a wrong KV byte shows up as a changed
token.  Needs ``torch`` and ``transformers`` (both come with vLLM).
"""

from __future__ import annotations

import os

__all__ = ["build"]


def build(
    out: str | os.PathLike[str],
    *,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,
    intermediate: int | None = None,
    vocab: int = 512,
    max_positions: int = 4096,
    dtype: str = "float32",
    init_range: float = 0.3,
    seed: int = 0,
) -> str:
    """Write ``config.json`` and weights of a random Llama to ``out``; return its path.

    vLLM's CPU attention wants ``head_dim`` >= 32.  A wide ``init_range``
    makes outputs sensitive to every KV value; 0.02 (the usual) gives a
    numerically tame model for timing.  No tokenizer: runs pass token ids.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate or 2 * hidden,
        vocab_size=vocab,
        max_position_embeddings=max_positions,
        initializer_range=init_range,
        dtype=dtype,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))  # type: ignore[no-untyped-call]
    model.save_pretrained(os.fspath(out))
    return os.fspath(out)
