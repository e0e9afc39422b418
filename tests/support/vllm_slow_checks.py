"""What the two slow-tier engine test modules share: the prompt, the skip, the output check.

``tests/contrib/test_vllm_slow_tier.py`` and
``tests/contrib/test_vllm_learned_recompute.py`` time the same prompt in fresh
engine processes (:mod:`vllm_slow_tier`) behind the same tier, slowed by the
same factor, and hold every run's output to a run without offloading.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Protocol

import pytest
from shared_pool import build_tiny_model
from vllm_slow_tier import run_engine

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)

TOKENS = 2048
CHUNK = 32  # tokens a block: vLLM's block size, one kvtier key each
SLOWER = 3.0  # loading the prompt from the slow tier takes this many recomputes

class Engine(Protocol):
    def __call__(self, config: Path | None, store: bool = False) -> dict[str, Any]: ...


def prompt_engine(tmp_path: Path, plugin_site: str) -> Engine:
    """Runs the prompt in a fresh engine process on a tiny model built under ``tmp_path``, the
    sample plugin importable from ``plugin_site``: ``engine(config, store=False)``, with no
    offloading where ``config`` is None."""
    model = build_tiny_model(tmp_path / "model")

    def engine(config: Path | None, store: bool = False) -> dict[str, Any]:
        return run_engine(model, TOKENS, config, store=store, pythonpath=plugin_site)

    return engine


def same_output(run: dict[str, Any], reference: dict[str, Any]) -> None:
    """The same first token as ``reference``'s, and the same top logprobs within 1e-3.

    The messages say what differs: pytest does not rewrite the asserts of a support module.
    """
    assert run["token"] == reference["token"], (run["token"], reference["token"])
    assert run["logprobs"].keys() == reference["logprobs"].keys(), (run, reference)
    for token, logprob in reference["logprobs"].items():
        assert run["logprobs"][token] == pytest.approx(logprob, abs=1e-3), (token, run, reference)
