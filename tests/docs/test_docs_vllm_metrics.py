"""The load decision's figures on vLLM's ``/metrics`` are named where operators read of them:
docs/load-policy.md's "What the dashboards show" and the vLLM integration's "Stats"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PREFIX = "vllm:kv_offload_kvtier_"


def _names(text: str) -> set[str]:
    """The metrics ``text`` names as code, ``..._x`` read as ``PREFIX + x``; braces unfolded."""
    names = set()
    for code in re.findall(r"`([^`]+)`", text.replace("\n  ", "")):
        if code.startswith("..._"):
            code = PREFIX + code[4:]
        if (folded := re.fullmatch(r"(\S+_)\{([\w,]+)\}", code)) is not None:
            names |= {folded[1] + part for part in folded[2].split(",")}
        elif code.startswith(PREFIX):
            names.add(code.split("{", 1)[0])
    return names


def test_every_decision_metric_vllm_gets_is_documented_and_declared() -> None:
    pytest.importorskip("vllm")
    from kvtier.contrib.vllm.tier_metrics import DECISION_METRICS, metric_definitions

    assert set(DECISION_METRICS) <= set(metric_definitions())
    doc = (ROOT / "docs" / "load-policy.md").read_text()
    section = doc.split("## What the dashboards show\n", 1)[1].split("\n## ", 1)[0]
    (bullet,) = (b for b in section.split("\n* ") if b.startswith("vLLM's `/metrics`"))
    assert _names(bullet) == set(DECISION_METRICS)
    readme = (ROOT / "contrib" / "vllm" / "README.md").read_text()
    stats = readme.split("## Stats\n", 1)[1].split("\n## ", 1)[0]
    assert set(DECISION_METRICS) - _names(stats) == set()
