"""``kvtier inspect`` and ``purge`` on an ``fs`` root whose pool evicts across namespaces.

Two chains of two models share one root with ``capacity_scope: pool``; the
second model writes last, so eviction takes the oldest: the descriptors
first, if nothing keeps them.  The commands run through click's CliRunner on
the chains' own YAML file; the files under the root are the proof.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import kvtier
from kvtier.chain.catalog import CATALOG_HEX
from kvtier.cli import cli

MODEL_A = kvtier.Namespace(model="model-a", dtype="bfloat16", tokens_per_block=16)
MODEL_B = kvtier.Namespace(model="model-b", dtype="bfloat16", tokens_per_block=16)
SIZE = 16 << 10


def blocks_of(root: Path, ns: str) -> set[str]:
    return {name for _, _, names in os.walk(root / ns) for name in names
            if name.endswith(".kvb")}


def fill(tmp_path: Path, eviction: str = "lru") -> tuple[Path, Path]:
    """Model A writes 60 blocks, then model B 10, into one pool of 1 MiB (64 blocks)."""
    root = tmp_path / "pool"
    tier = {"name": "disk", "backend": "fs", "url": str(root), "capacity": "1MiB",
            "capacity_scope": "pool", "direct_io": False, "eviction": eviction}
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump({"chain": [tier]}))
    with kvtier.open_chain(str(path), namespace=MODEL_B) as b_chain:  # B's descriptor first
        with kvtier.open_chain(str(path), namespace=MODEL_A) as a_chain:
            keys = [b"a%03d" % i for i in range(60)]
            assert a_chain.put(keys, [bytes([i]) * SIZE for i in range(60)]) == [True] * 60
        keys = [b"b%03d" % i for i in range(10)]
        assert b_chain.put(keys, [bytes([i]) * SIZE for i in range(10)]) == [True] * 10
    assert len(blocks_of(root, MODEL_B.hex)) == 10  # the newest: all kept
    assert len(blocks_of(root, MODEL_A.hex)) < 60  # the pool evicted to make room
    return root, path


@pytest.mark.parametrize("eviction", ["lru", "s3fifo"])
def test_the_pool_keeps_the_descriptor_of_a_namespace_with_blocks(tmp_path: Path,
                                                                  eviction: str) -> None:
    root, path = fill(tmp_path, eviction)
    descriptors = blocks_of(root, CATALOG_HEX)
    assert {f"{MODEL_A.hex}.kvb", f"{MODEL_B.hex}.kvb"} == descriptors
    shown = CliRunner().invoke(cli, ["inspect", str(path), "--json"])
    assert shown.exit_code == 0, shown.output
    (row,) = json.loads(shown.output)["tiers"]
    models = {ns["namespace"]: (ns["description"] or {}).get("model") for ns in row["namespaces"]}
    assert models == {MODEL_A.hex: "model-a", MODEL_B.hex: "model-b"}
    purged = CliRunner().invoke(cli, ["purge", str(path), "--model", "model-b", "--yes",
                                      "--json"])
    assert purged.exit_code == 0, purged.output
    assert json.loads(purged.output)["removed_blocks"] == 10
    assert blocks_of(root, MODEL_B.hex) == set()
    assert blocks_of(root, CATALOG_HEX) == {f"{MODEL_A.hex}.kvb"}  # B's went with them
    assert blocks_of(root, MODEL_A.hex)  # the other model's stay


def test_a_purge_by_model_that_cannot_judge_a_namespace_says_so_and_fails(
        tmp_path: Path) -> None:
    root, path = fill(tmp_path)
    # B's descriptor lost (as an older version's pool evicted it)
    for folder, _, names in os.walk(root / CATALOG_HEX):
        if f"{MODEL_B.hex}.kvb" in names:
            os.unlink(Path(folder) / f"{MODEL_B.hex}.kvb")
    assert f"{MODEL_B.hex}.kvb" not in blocks_of(root, CATALOG_HEX)
    purged = CliRunner().invoke(cli, ["purge", str(path), "--model", "model-b", "--yes"])
    assert purged.exit_code == 1, purged.output
    assert (f"namespace {MODEL_B.hex}: 10 block(s) kept, its descriptor is missing"
            in purged.output)
    assert f"purge them with --namespace {MODEL_B.hex}" in purged.output
    assert len(blocks_of(root, MODEL_B.hex)) == 10  # nothing guessed away
    by_ns = CliRunner().invoke(cli, ["purge", str(path), "--namespace", MODEL_B.hex, "--yes"])
    assert by_ns.exit_code == 0, by_ns.output
    assert "removed 10 block(s)" in by_ns.output
    assert blocks_of(root, MODEL_B.hex) == set()


def test_a_purge_that_cannot_remove_a_block_says_so_and_fails(tmp_path: Path) -> None:
    root, path = fill(tmp_path)
    stuck = next(Path(d) / n for d, _, names in os.walk(root / MODEL_B.hex) for n in names
                 if n.endswith(".kvb"))
    made = subprocess.run(["chattr", "+i", str(stuck)], capture_output=True, check=False)
    if made.returncode:
        pytest.skip(f"chattr +i refused here: {made.stderr.decode().strip()}")
    try:
        purged = CliRunner().invoke(cli, ["purge", str(path), "--model", "model-b", "--yes"])
        assert blocks_of(root, MODEL_B.hex) == {stuck.name}  # the others are gone
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
    assert purged.exit_code == 1, purged.output
    assert "removed 9 block(s)" in purged.output
    assert "error: 1 block(s) matched could not be removed and are still held" in purged.output
