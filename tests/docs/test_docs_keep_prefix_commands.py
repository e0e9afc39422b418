"""docs/tenants.md's ``--keep-prefix`` commands print the configurations shown above them
(paths aside: the docs name files under /etc)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from kvtier.cli import cli
from kvtier.config.prefixes import parse_prefixes
from kvtier.contrib.lmcache.prefixes import PREFIX_FIELDS as LMCACHE_FIELDS
from kvtier.contrib.sglang.args import PREFIX_FIELDS as SGLANG_FIELDS

DOC = (Path(__file__).parents[2] / "docs" / "tenants.md").read_text()
IDS = list(range(300))  # one full chunk of LMCache's default 256 tokens, and more


def documented(title: str, command: str) -> tuple[dict[str, Any], list[str]]:
    """The JSON example after ``title``, and the arguments of the ``command`` after it."""
    section = DOC[DOC.index(title):]
    code = re.search(r"```json\n(.*?)```", section, re.S)
    assert code is not None
    line = section.split(f"```\nkvtier {command} ", 1)[1].split("```", 1)[0]
    return json.loads(code.group(1)), shlex.split(line.replace("\\\n", " "))


def here(tmp_path: Path, args: list[str]) -> list[str]:
    """The arguments with the chain's YAML and the token ids in ``tmp_path``."""
    ids = tmp_path / "support-bot.json"
    ids.write_text(json.dumps(IDS))
    chain = tmp_path / "tiers.yaml"
    chain.write_text(yaml.safe_dump({"chain": [
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "fs")}]}))
    return [a.replace("/etc/kvtier/support-bot.json", str(ids))
             .replace("/etc/kvtier/tiers.yaml", str(chain)) for a in args]


def test_the_sglang_command_prints_the_extra_config(tmp_path: Path) -> None:
    extra, args = documented("**A named prefix, in the SGLang adapter.**", "sglang-args")
    assert args[0] == extra["kvtier_config"]
    result = CliRunner().invoke(cli, ["sglang-args", *here(tmp_path, args)])
    assert result.exit_code == 0, result.output
    flags = shlex.split(result.output.splitlines()[1])
    got = json.loads(flags[flags.index("--hicache-storage-backend-extra-config") + 1])
    assert got.pop("kvtier_config") == str(tmp_path / "tiers.yaml")
    want = {k: v for k, v in extra.items() if k != "kvtier_config"}
    for entry in want["keep_prefixes"]:
        entry["token_ids_file"] = str(tmp_path / "support-bot.json")
    # the doc's "extra_key": null is left out by the command: the same entry
    assert parse_prefixes(got.pop("keep_prefixes"), SGLANG_FIELDS) == parse_prefixes(
        want.pop("keep_prefixes"), SGLANG_FIELDS)
    assert got == want


def test_the_lmcache_command_prints_the_adapter(tmp_path: Path) -> None:
    spec, args = documented("**A named prefix, in the LMCache adapter.**", "lmcache-args")
    params = spec["adapter_params"]
    assert args[0] == params["kvtier_config"]
    result = CliRunner().invoke(cli, ["lmcache-args", *here(tmp_path, args), "--json-only"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    assert {k: v for k, v in got.items() if k != "adapter_params"} == {
        k: v for k, v in spec.items() if k != "adapter_params"}
    got_params = got["adapter_params"]
    assert got_params.pop("kvtier_config") == str(tmp_path / "tiers.yaml")
    params.pop("kvtier_config")
    for entry in params["keep_prefixes"]:
        entry["token_ids_file"] = str(tmp_path / "support-bot.json")
    assert got_params == params
    assert parse_prefixes(got_params["keep_prefixes"], LMCACHE_FIELDS)[0].token_ids == tuple(IDS)
