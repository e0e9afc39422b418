"""docs/tenants.md's ``keep_prefixes`` example is an entry the vLLM tier takes as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

DOC = (Path(__file__).parents[2] / "docs" / "tenants.md").read_text()


def test_the_named_prefix_example_is_a_tier_option(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm")
    from kvtier.contrib.vllm.keep_prefixes import KeepPrefix
    from kvtier.contrib.vllm.tier_options import TierOptions

    section = DOC[DOC.index("**A named prefix, from the vLLM tier's options.**"):]
    code = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert code is not None
    entry = yaml.safe_load(code.group(1))
    file = entry["keep_prefixes"][0]["token_ids_file"]
    (tmp_path / file).write_text(json.dumps([1, 2, 3]))
    monkeypatch.chdir(tmp_path)  # the example's file name is relative
    options = TierOptions.checked(
        "KvtierTier", config="tiers.yaml", namespace_extra=None, model_name=None,
        keep_host_tier=False, lookup_timeout=2, verdict_ttl=2, failed_ttl=30, job_workers=8,
        reopen_interval=30, locality=None, load_timeout=None, **entry)
    assert options.keep_prefixes == (KeepPrefix("support-bot", "acme", (1, 2, 3), "salt-acme"),)
