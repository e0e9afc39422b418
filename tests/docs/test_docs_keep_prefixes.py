"""docs/tenants.md's ``keep_prefixes`` example is an entry the vLLM tier takes as written,
and ``kvtier vllm-args --keep-prefix`` prints it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvtier.cli import cli

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


def test_the_vllm_args_command_prints_the_example(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    section = DOC[DOC.index("**A named prefix, from the vLLM tier's options.**"):]
    code = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert code is not None
    (want,) = yaml.safe_load(code.group(1))["keep_prefixes"]
    line = section.split("```\nkvtier vllm-args ", 1)[1].split("```", 1)[0]
    args = shlex.split(line.replace("\\\n", " "))
    assert args[0] == "/etc/kvtier/tiers.yaml"
    args[0] = str(tmp_path / "tiers.yaml")
    (tmp_path / "tiers.yaml").write_text(yaml.safe_dump({"chain": [
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "fs")}]}))
    (tmp_path / want["token_ids_file"]).write_text(json.dumps([1, 2, 3]))
    monkeypatch.chdir(tmp_path)  # the example's file name is relative
    result = CliRunner().invoke(cli, ["vllm-args", *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.output)["kv_connector_extra_config"]["secondary_tiers"]
    assert entry["keep_prefixes"] == [{**want,
                                       "token_ids_file": str(tmp_path / want["token_ids_file"])}]
