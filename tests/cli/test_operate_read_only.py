"""``kvtier inspect`` and ``scrub`` (without ``--repair``) look without writing, and a tier
the commands could not open makes them exit 3, never 0.

The fs root is checked file by file (names, sizes, modification times, of
directories too) before and after; a read-only root is a real tmpfs
remounted read-only (the tests run as root), unmounted after.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

import kvtier
from kvtier.cli import cli

NS = kvtier.Namespace(model="llama-ro", dtype="bfloat16", tokens_per_block=16)
DATA = {b"k%02d" % i: bytes([i]) * (2000 + 31 * i) for i in range(10)}
LOOKS = [("inspect",), ("inspect", "--json"), ("scrub",), ("scrub", "--json")]
POOL_DB = ".kvtier-pool.db"


def chain_file(path: Path, root: Path, **disk: Any) -> str:
    path.write_text(yaml.safe_dump({"chain": [
        {"name": "ram", "backend": "host", "capacity": "1MiB"},
        {"name": "disk", "backend": "fs", "url": f"file://{root}", **disk}]}))
    return str(path)


def fill(config: str) -> None:
    with kvtier.open_chain(config, namespace=NS) as chain:
        assert chain.put(list(DATA), list(DATA.values())) == [True] * len(DATA)


def tree(root: Path) -> dict[str, tuple[bool, int, int]]:
    """Every path under ``root``: (is a directory, size, mtime in ns)."""
    out = {}
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        out[str(path.relative_to(root))] = (path.is_dir(), st.st_size, st.st_mtime_ns)
    return out


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def disk_row(result: Result) -> dict[str, Any]:
    (row,) = [t for t in json.loads(result.stdout)["tiers"] if t["tier"] == "disk"]
    return row


@pytest.fixture
def ro_mount(tmp_path: Path) -> Iterator[Path]:
    """A small tmpfs, writable until :func:`remount_ro`; unmounted after the test."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def remount_ro(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    with pytest.raises(OSError):  # the mount really is read-only
        (mnt / "probe").write_bytes(b"")


@pytest.mark.parametrize("command", LOOKS, ids=" ".join)
def test_a_look_leaves_the_root_as_it_was(tmp_path: Path, command: tuple[str, ...]) -> None:
    """No temp file, no pool index where there was none, no index.kvi rewritten, no
    directory made: every name, size and mtime under the root is as before."""
    root = tmp_path / "kv"
    fill(chain_file(tmp_path / "engine.yaml", root))  # no capacity: no pool index
    # the operator's file bounds the root: opening it to write would create the pool index
    config = chain_file(tmp_path / "ops.yaml", root, capacity="64MiB")
    before = tree(root)
    assert any(name.endswith("index.kvi") for name in before)  # left by the engine's close
    result = run(command[0], config, *command[1:])
    assert result.exit_code == 0, result.output
    if "--json" in command:
        row = disk_row(result)
        blocks = sum(n["blocks"] for n in row["namespaces"]) if "namespaces" in row \
            else row["checked"] - 1  # scrub also checks the namespace's descriptor
        assert blocks == len(DATA)
    after = tree(root)
    assert POOL_DB not in after
    assert after == before


def test_a_look_at_a_pooled_root_leaves_its_index_alone(tmp_path: Path) -> None:
    root = tmp_path / "kv"
    config = chain_file(tmp_path / "chain.yaml", root, capacity="64MiB")
    fill(config)
    before = tree(root)
    assert POOL_DB in before
    for command in LOOKS:
        assert run(command[0], config, *command[1:]).exit_code == 0
    assert tree(root) == before


def test_a_damaged_pool_index_does_not_stop_a_look(tmp_path: Path) -> None:
    """inspect and scrub need no pool index: they list and read the block files."""
    root = tmp_path / "kv"
    config = chain_file(tmp_path / "chain.yaml", root, capacity="64MiB")
    fill(config)
    for name in os.listdir(root):  # the index and its write-ahead log, garbage
        if name.startswith(POOL_DB):
            (root / name).write_bytes(b"not a database " * 100)
    before = tree(root)
    inspect = run("inspect", config, "--json")
    assert inspect.exit_code == 0, inspect.output
    (ns,) = disk_row(inspect)["namespaces"]
    assert (ns["namespace"], ns["blocks"]) == (NS.hex, len(DATA))
    assert ns["description"]["model"] == NS.model
    scrub = run("scrub", config, "--json")
    assert scrub.exit_code == 0, scrub.output
    assert disk_row(scrub)["checked"] == len(DATA) + 1  # and the descriptor
    assert tree(root) == before


def test_a_read_only_mount(tmp_path: Path, ro_mount: Path) -> None:
    """inspect and scrub read it; purge cannot delete there and exits 3, saying why."""
    root = ro_mount / "kv"
    config = chain_file(tmp_path / "chain.yaml", root, capacity="4MiB")
    fill(config)
    remount_ro(ro_mount)
    before = tree(ro_mount)

    inspect = run("inspect", config, "--json")
    assert inspect.exit_code == 0, inspect.output
    (ns,) = disk_row(inspect)["namespaces"]
    assert (ns["blocks"], ns["codecs"]) == (len(DATA), {"none": len(DATA)})
    scrub = run("scrub", config)
    assert scrub.exit_code == 0, scrub.output
    assert f"tier disk (fs): {len(DATA) + 1} block(s) checked" in scrub.stdout

    for purge in (("purge", config, "--model", NS.model, "--yes"),
                  ("purge", config, "--model", NS.model, "--yes", "--json"),
                  ("scrub", config, "--repair")):
        result = run(*purge)
        assert result.exit_code == 3, result.output
        if "--json" in purge:
            assert disk_row(result)["failed"].startswith("cannot open: ")
            assert json.loads(result.stdout)["failed"] == 1
        else:
            assert "tier disk (fs): FAILED, cannot open: " in result.stdout
            assert "Read-only file system" in result.stdout
        assert result.stderr.splitlines() == [
            "error: 'disk': could not be opened, so not looked at"
            + ("" if "--json" in purge else " (see above)")]
    assert tree(ro_mount) == before


def test_a_tier_that_cannot_be_opened_fails_the_command(tmp_path: Path) -> None:
    """An object store nobody answers for: reported as failed, exit 3, the others done."""
    root = tmp_path / "kv"
    fill(chain_file(tmp_path / "engine.yaml", root))
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump({"chain": [
        {"name": "ram", "backend": "host", "capacity": "1MiB"},
        {"name": "disk", "backend": "fs", "url": f"file://{root}"},
        {"name": "s3", "backend": "object", "bucket": "kv", "endpoint": "http://127.0.0.1:9",
         "access_key_id": "operator-key", "secret_access_key": "operator-secret",
         "request_timeout": "1s", "connect_timeout": "1s"}]}))
    config = str(path)
    for command in ("inspect", "scrub"):
        result = run(command, config, "--json")
        assert result.exit_code == 3, result.output
        tiers = {t["tier"]: t for t in json.loads(result.stdout)["tiers"]}
        assert "memory of the process" in tiers["ram"]["skipped"]  # RAM: skipped, as before
        assert "failed" not in tiers["ram"] and "skipped" not in tiers["disk"]
        assert tiers["s3"]["failed"].startswith("cannot open: object tier s3://kv/")
        done = tiers["disk"]
        assert (sum(n["blocks"] for n in done["namespaces"]) if command == "inspect"
                else done["checked"]) == len(DATA) + (command == "scrub")
    table = run("inspect", config)
    assert table.exit_code == 3
    assert "tier ram (host): skipped, holds blocks only in the memory" in table.stdout
    assert "tier s3 (object): FAILED, cannot open: " in table.stdout
