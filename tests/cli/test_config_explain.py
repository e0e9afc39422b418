"""``kvtier config explain``: its table and its ``--json`` give the same rows, from the real
backends' options, secrets masked; a file with problems is one line per problem, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtier.cli import cli
from kvtier.config import explain, load_config

SECRET = "s3-secret-" + "x7" * 8
TEXT = """\
chain:
  - name: ram
    backend: host
    capacity: 1GiB
  - name: s3
    backend: object
    endpoint: http://127.0.0.1:8333
    bucket: kv
    access_key_id: kvtier
    secret_access_key: ${S3_SECRET}
    write: back
"""


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("S3_SECRET", SECRET)
    path = tmp_path / "tiers.yaml"
    path.write_text(TEXT)
    return str(path)


def test_json_rows_are_the_table_rows(config_file: str) -> None:
    as_json = CliRunner().invoke(cli, ["config", "explain", "--json", config_file],
                                 catch_exceptions=False)
    table = CliRunner().invoke(cli, ["config", "explain", config_file],
                               catch_exceptions=False)
    assert as_json.exit_code == 0 and table.exit_code == 0, as_json.output + table.output
    assert SECRET not in as_json.stdout and SECRET not in table.stdout
    document = json.loads(as_json.stdout)
    assert document["file"] == config_file
    settings = document["settings"]
    assert settings == [s.as_json() for s in explain(load_config(config_file))]
    secret = next(s for s in settings if s["key"] == "secret_access_key")
    assert secret == {"tier": "s3", "key": "secret_access_key", "value": "***", "source": "env",
                      "where": f"{config_file}:10", "variables": ["S3_SECRET"]}
    timeout = next(s for s in settings if s["key"] == "timeout")  # was request_timeout
    assert (timeout["value"], timeout["source"]) == ("30s", "default")
    cells = [[c.strip() for c in line.split("│")[1:-1]]
             for line in table.stdout.splitlines() if line.startswith("│")]
    assert cells == [[s["tier"], s["key"], s["value"],
                      f"env ({', '.join(s['variables'])})" if s["variables"] else s["source"],
                      s["where"].rpartition(":")[2] if s["where"] else "-"]
                     for s in settings]
    assert ["s3", "secret_access_key", "***", "env (S3_SECRET)", "10"] in cells
    assert ["ram", "capacity", "1GiB", "file", "4"] in cells


def test_a_bad_file_is_one_line_per_problem(tmp_path: Path) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text(TEXT.replace("1GiB", "lots").replace("write: back", "writes: back"))
    for args in ([], ["--json"]):
        result = CliRunner().invoke(cli, ["config", "explain", *args, str(path)])
        assert result.exit_code == 2 and result.stdout == ""
        # S3_SECRET is not set here: a third problem
        first, env, key, total = result.stderr.splitlines()
        assert first == (f"error: {path}:4: chain[0].capacity: expected a size such as 8GiB, "
                         "500MB or 4096 (bytes), got 'lots' (tier 'ram')")
        assert env == (f"error: {path}:10: chain[1].secret_access_key: environment variable "
                       "S3_SECRET is not set (use ${S3_SECRET:-default} for a fallback) "
                       "(tier 's3')")
        assert key.startswith(f"error: {path}:11: chain[1].writes: unknown key 'writes'; "
                              "did you mean 'write'? Accepted for backend 'object': ")
        assert total == f"{path}: 3 problem(s)"
