"""A small random Llama for vLLM runs on the CPU, built on the spot (no hub access).

``python tests/support/make_tiny_llama.py OUT [--layers N --hidden H --heads A --kv-heads K
--head-dim D --dtype float32]`` writes ``config.json`` and weights to ``OUT``.
The defaults are the test model: 2 layers, head_dim 32 (the smallest vLLM's
CPU attention takes), weights drawn wide (``initializer_range`` 0.3) so that
wrong KV visibly changes greedy output.  No tokenizer: runs pass token ids.
The builder itself is :func:`kvtier.contrib.vllm.randmodel.build`.
"""

from __future__ import annotations

import argparse

from kvtier.contrib.vllm.randmodel import build


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
