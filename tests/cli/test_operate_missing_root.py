"""``kvtier inspect``, ``scrub`` and ``purge`` on a store that does not exist: an error
naming the path (exit 2), and nothing created; the fs option behind it, ``create``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import kvtier
from kvtier.cli import cli
from kvtier.spec import ConfigError

COMMANDS = [("inspect",), ("inspect", "--json"), ("scrub",), ("scrub", "--repair"),
            ("purge", "--model", "llama", "--yes")]


def chain_file(tmp_path: Path, url: str, **disk: object) -> str:
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump({"chain": [
        {"name": "ram", "backend": "host", "capacity": "1MiB"},
        {"name": "disk", "backend": "fs", "url": url, **disk}]}))
    return str(path)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("form", ["file://", ""])
def test_a_mistyped_root_is_an_error_and_stays_missing(tmp_path: Path, command: tuple[str, ...],
                                                       form: str) -> None:
    mistyped = tmp_path / "kv-cahce"
    root = mistyped / "node0"
    config = chain_file(tmp_path, f"{form}{root}")
    result = CliRunner().invoke(cli, [command[0], config, *command[1:]])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {config}:7: chain[1].url: ")
    assert f"the directory {root} does not exist" in line and line.endswith("(tier 'disk')")
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiers.yaml"]


def test_the_commands_still_read_a_store_that_exists(tmp_path: Path) -> None:
    root = tmp_path / "kv"
    config = chain_file(tmp_path, f"file://{root}")
    with kvtier.open_chain(config, namespace="llama") as chain:
        assert chain.put([b"a", b"b"], [b"\x01" * 500, b"\x02" * 700]) == [True, True]
    result = CliRunner().invoke(cli, ["scrub", config, "--json"])
    assert result.exit_code == 0, result.output
    assert '"checked": 3' in result.stdout  # two blocks and the namespace's descriptor


def test_create_false_needs_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "mnt" / "kv"
    config = chain_file(tmp_path, str(root), create=False)
    with pytest.raises(ConfigError) as info:
        kvtier.open_chain(config, namespace="m")
    assert info.value.key == "chain[1].url" and str(root) in str(info.value)
    assert not (tmp_path / "mnt").exists()
    root.mkdir(parents=True)
    with kvtier.open_chain(config, namespace="m") as chain:
        assert chain.put([b"k"], [b"v" * 100]) == [True]
        assert chain.get_bytes([b"k"]) == [b"v" * 100]
