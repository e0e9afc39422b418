"""The integrations' commands come through the ``kvtier.commands`` entry points, loaded on use."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kvtier.cli import cli, commands
from kvtier.cli.commands import GROUP, PluginGroup

ROOT = Path(__file__).resolve().parents[2]


def test_loading_the_command_line_imports_no_integration() -> None:
    code = ("import sys, kvtier.cli; "
            "print(sorted(m for m in sys.modules if m.startswith('kvtier.contrib')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_the_integrations_commands_are_entry_points() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    declared = text.split(f'[project.entry-points."{GROUP}"]')[1].split("\n[")[0]
    names = sorted(line.split("=")[0].strip() for line in declared.splitlines()
                   if "=" in line)
    assert names == ["calibrate", "lmcache-args", "sglang-args", "vllm-args"]
    for name in names:  # installed (pip install -e .) and listed by the command line
        assert name in cli.list_commands(click.Context(cli))


def test_an_entry_point_command_runs(tmp_path: Path) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text("chain:\n  - {name: disk, backend: fs, url: 'file:///tmp/x'}\n")
    result = CliRunner().invoke(cli, ["sglang-args", str(path)])
    assert result.exit_code == 0, result.output
    assert "--hicache-storage-backend dynamic" in result.output


def _group(monkeypatch: pytest.MonkeyPatch, *eps: tuple[str, str]) -> PluginGroup:
    found = [EntryPoint(name=name, value=value, group=GROUP) for name, value in eps]
    monkeypatch.setattr(commands, "entry_points", lambda group: found if group == GROUP else [])

    @click.group(cls=PluginGroup)
    def group() -> None:
        """A command line."""

    @group.command()
    def hello() -> None:
        click.echo("hello")

    assert isinstance(group, PluginGroup)
    return group


def test_a_broken_command_costs_one_warning_line(monkeypatch: pytest.MonkeyPatch) -> None:
    group = _group(monkeypatch, ("broken", "kvtier_no_such_module:command"),
                   ("not-a-command", "kvtier.console:PIPE_WIDTH"),
                   ("vllm-args", "kvtier.contrib.vllm.args:vllm_args_command"),
                   ("hello", "kvtier_no_such_module:command"))  # the built-in wins
    result = CliRunner().invoke(group, ["--help"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "kvtier: warning: command 'broken' from kvtier_no_such_module:command not loaded: "
        "ModuleNotFoundError: No module named 'kvtier_no_such_module'",
        "kvtier: warning: command 'not-a-command' from kvtier.console:PIPE_WIDTH not loaded: "
        "int is not a click command",
    ]
    listed = [line.split()[0] for line in result.stdout.split("Commands:")[1].splitlines()
              if line.strip()]
    assert listed == ["hello", "vllm-args"]
    assert CliRunner().invoke(group, ["hello"]).stdout == "hello\n"
    ran = CliRunner().invoke(group, ["broken"])
    assert ran.exit_code == 2 and "No such command 'broken'" in ran.stderr
