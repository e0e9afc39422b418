"""The command line's tables written to a pipe: each row whole on one line, no word broken.

Through click's CliRunner (its stdout is no terminal) and through a real
pipe from a ``kvtier`` process, with and without a narrow ``COLUMNS``: every
cell this checks is longer than its share of 80 columns, which is where rich
used to wrap it mid-word.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import kvtier
from kvtier.cli import cli
from kvtier.plugins.registry import default_registry

LONG_MODEL = "org-with-a-long-name/model-" + "-".join(f"part{i}" for i in range(30))


def expected_backend_cells() -> dict[str, str]:
    """Each installed backend's options, as ``kvtier backends`` writes them."""
    registry = default_registry()
    cells = {}
    for name in registry.names():
        options = registry.create(name).options()
        cells[name] = ", ".join(f"{o.key or k}{'*' if o.required else ''}:{o.type}"
                                for k, o in options.items() if not o.internal)
    return cells


def row_of(text: str, first_cell: str) -> str:
    """The one line of a table whose first cell is ``first_cell``."""
    (line,) = [ln for ln in text.splitlines()
               if ln.startswith("│") and ln.split("│")[1].strip() == first_cell]
    return line


def check_backends(text: str) -> None:
    cells = expected_backend_cells()
    assert len([c for c in cells.values() if len(c) > 80]) >= 1  # wider than 80 columns
    for name, options in cells.items():
        assert options in row_of(text, name), text


def piped(*args: str, columns: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    # capture_output: stdout and stderr are pipes, and stdin no terminal either
    return subprocess.run([sys.executable, "-m", "kvtier.cli", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=env, timeout=300, check=False)


def test_backends_rows_whole_through_clirunner() -> None:
    result = CliRunner().invoke(cli, ["backends"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    check_backends(result.stdout)


@pytest.mark.parametrize("columns", [None, "60"])
def test_backends_rows_whole_in_a_pipe(columns: str | None) -> None:
    proc = piped("backends", columns=columns)
    assert proc.returncode == 0, proc.stderr
    check_backends(proc.stdout)


def test_conformance_report_rows_whole_in_a_pipe() -> None:
    proc = piped("conformance", "host", "--option", "capacity=64MiB", "--group", "persistence",
                 columns=None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "backend 'host' does not declare persistent=True" in row_of(proc.stdout,
                                                                       "persistence")
    assert "not selected" in row_of(proc.stdout, "put_get")


def test_explain_and_inspect_rows_whole(tmp_path: Path) -> None:
    root = tmp_path / ("a-directory-with-a-long-name-" * 4) / "kv"
    config = tmp_path / "tiers.yaml"
    config.write_text(yaml.safe_dump({"chain": [
        {"name": "ram", "backend": "host", "capacity": "1MiB"},
        {"name": "disk", "backend": "fs", "url": f"file://{root}"}]}))
    explained = CliRunner().invoke(cli, ["config", "explain", str(config)],
                                   catch_exceptions=False)
    assert explained.exit_code == 0, explained.output
    (url,) = [ln for ln in explained.stdout.splitlines() if "│ url " in ln]
    line = next(i for i, ln in enumerate(config.read_text().splitlines(), 1) if "url:" in ln)
    assert [c.strip() for c in url.split("│")[1:-1]] == ["disk", "url", f"file://{root}",
                                                          "file", str(line)]

    namespace = kvtier.Namespace(LONG_MODEL, dtype="bfloat16", tokens_per_block=16)
    with kvtier.open_chain(str(config), namespace=namespace) as chain:
        assert chain.put([b"k"], [b"\x07" * 1000]) == [True]
    inspected = CliRunner().invoke(cli, ["inspect", str(config), "--tier", "disk"],
                                   catch_exceptions=False)
    assert inspected.exit_code == 0, inspected.output
    row = row_of(inspected.stdout, namespace.hex[:12])
    assert f"│ {LONG_MODEL} │ bfloat16, 16" in row
