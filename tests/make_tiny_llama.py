"""A small random Llama for vLLM runs on the CPU, built on the spot (no hub access).

``python tests/make_tiny_llama.py OUT [--layers N --hidden H --heads A --kv-heads K
--head-dim D --dtype float32]`` writes ``config.json`` and weights to ``OUT``.
The defaults are the test model: 2 layers, head_dim 32 (the smallest vLLM's
CPU attention takes), weights drawn wide (``initializer_range`` 0.3) so that
wrong KV visibly changes greedy output.  No tokenizer: runs pass token ids.
"""

from __future__ import annotations

import argparse
import os


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
    """Write the model to ``out``; return its path."""
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
        torch_dtype=dtype,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(os.fspath(out))
    return os.fspath(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--max-positions", type=int, default=4096)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--init-range", type=float, default=0.3)
    args = parser.parse_args()
    print(
        build(
            args.out,
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            vocab=args.vocab,
            max_positions=args.max_positions,
            dtype=args.dtype,
            init_range=args.init_range,
        )
    )


if __name__ == "__main__":
    main()
