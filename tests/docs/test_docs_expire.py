"""docs/tenants.md's deadline examples run as written: a block past its deadline is a miss,
and the ``kv_hints`` example names the action and payload the vLLM tier reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = (Path(__file__).parents[2] / "docs" / "tenants.md").read_text()
SECTION = DOC[DOC.index("### A deadline per block"):DOC.index("## Keep (available")]


def test_the_chain_expire_example_runs() -> None:
    code = re.findall(r"```python\n(.*?)```", SECTION, re.S)
    assert len(code) == 2
    exec(compile(code[0], "docs/tenants.md#a-deadline-per-block", "exec"), {})  # our own docs


def test_the_kv_hints_example_gives_the_deadline_the_vllm_tier_reads() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.base import ReqContext

    from kvtier.contrib.vllm.hints import RequestHints, retention

    code = re.findall(r"```python\n(.*?)```", SECTION, re.S)[1]
    scope: dict[str, object] = {}
    exec(compile(code, "docs/tenants.md#kv-hints-expire", "exec"), scope)  # our own docs
    hints = retention(ReqContext(req_id="r", kv_hints=scope["one_off"]))
    assert hints == RequestHints(keep=False, expire_after=600.0)
