"""docs/tenants.md's Keep example runs as written: kept blocks survive pressure."""

from __future__ import annotations

import re
from pathlib import Path

DOC = (Path(__file__).parents[2] / "docs" / "tenants.md").read_text()


def test_the_keep_example_runs() -> None:
    section = DOC[DOC.index("## Keep (available"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    exec(compile(code.group(1), "docs/tenants.md#keep", "exec"), {})  # our own docs


def test_the_kv_hints_example_names_the_action_the_vllm_tier_reads() -> None:
    import pytest

    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.base import ReqContext

    from kvtier.contrib.vllm.hints import keeps

    section = DOC[DOC.index("**From vLLM's `kv_hints`.**"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    scope: dict[str, object] = {}
    exec(compile(code.group(1), "docs/tenants.md#kv-hints", "exec"), scope)  # our own docs
    assert keeps(ReqContext(req_id="r", kv_hints=scope["keep"]))
