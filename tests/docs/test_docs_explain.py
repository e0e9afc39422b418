"""The README's ``kvtier config explain`` output is what the command prints for its example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtier.cli import cli

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def cells(text: str, edge: str) -> list[list[str]]:
    return [[c.strip() for c in line.split(edge)[1:-1]]
            for line in text.splitlines() if line.startswith(edge)]


def test_readme_explain_rows_are_the_commands(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (example,) = re.findall(r"```yaml\n(.*?)```", README, flags=re.S)
    (shown,) = [b for b in re.findall(r"```text\n(.*?)```", README, flags=re.S)
                if "settings of the chain in" in b]
    assert example.count("capacity: 500GiB") == 1
    (tmp_path / "tiers.yaml").write_text(example.replace("capacity: 500GiB",
                                                         "capacity: ${NVME_CAPACITY}"))
    monkeypatch.setenv("NVME_CAPACITY", "500GiB")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["config", "explain", "tiers.yaml"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert shown.splitlines()[0].strip() == result.stdout.splitlines()[0].strip()
    assert cells(shown, "┃") == cells(result.stdout, "┃")  # the header
    rows, documented = cells(result.stdout, "│"), cells(shown, "│")
    assert len(documented) >= 10
    assert [r for r in rows if r in documented] == documented  # in the command's order
