"""``kvtier inspect`` gives each tier's expected time to load a usual block,
fitted by the chain's cost model from the blocks it reads for the codec mix."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

import kvtier
from kvtier.cli import cli

NS = kvtier.Namespace(model="inspect-load", dtype="bfloat16", tokens_per_block=16)


def test_inspect_reports_the_expected_load_time_of_a_block(tmp_path: Path) -> None:
    root = tmp_path / "store"
    config = {"chain": [{"name": "disk", "backend": "fs", "url": str(root)}]}
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump(config))
    keys = [b"block-%d" % i for i in range(8)]
    with kvtier.open_chain(str(path), namespace=NS) as chain:
        assert chain.put(keys, [bytes([i]) * 65536 for i in range(8)]) == [True] * 8
    result = CliRunner().invoke(cli, ["inspect", str(path), "--json"])
    assert result.exit_code == 0, result.output
    tier = json.loads(result.output)["tiers"][0]
    (ns,) = [n for n in tier["namespaces"] if n["namespace"] == NS.hex]
    assert ns["sampled"] == 8 and ns["block_load_s"] > 0
    assert tier["block_load_s"] == ns["block_load_s"]
    tables = CliRunner().invoke(cli, ["inspect", str(path)])
    assert "expected load of a usual block:" in tables.output
    none_read = CliRunner().invoke(cli, ["inspect", str(path), "--json", "--sample", "0"])
    assert json.loads(none_read.output)["tiers"][0]["block_load_s"] is None
