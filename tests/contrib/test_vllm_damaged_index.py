"""A vLLM engine whose ``fs`` tier's pool index is damaged starts and serves.

Engine A (``vllm_runner.py``, vLLM's CPU build, the tiny random Llama) runs
the chain host -> fs with a ``capacity`` (so a shared pool,
``<root>/.kvtier-pool.db``) and stores three prompts' blocks.  Once it is
gone, the index is overwritten with garbage (``file is not a database``).
Engine B then starts on the same root: the fs tier moves the damaged index
aside and builds a new one from the block files (a warning names the index),
and B serves the prompts from A's blocks on disk, its RAM tier empty, with
the outputs of an engine without offloading.  Before the index was rebuilt,
SQLite's ``DatabaseError`` (no ``OSError``) failed the chain's open.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from runner_process import RunnerProcess
from shared_pool import engine_env
from vllm_chain import host_tier, write_yaml

from kvtier.backends.fs.pool import DB_NAME

SUPPORT = Path(__file__).parents[1] / "support"
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)


def prompt(step: int, start: int) -> list[int]:
    """132 tokens: 4 full blocks of 32 (what the tiers store) and 4 more."""
    return [(i * step + start) % 500 + 3 for i in range(132)]


PROMPTS = {"warm": [5, 6, 7], "a1": prompt(37, 11), "a2": prompt(53, 7), "a3": prompt(71, 5)}
NAMES = ["a1", "a2", "a3"]
BLOCKS, CACHED = 4, 128  # full blocks per prompt, tokens a tier can serve


class Engine(RunnerProcess):
    def __init__(self, workdir: Path, model: str, phases: str, config: Path | None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(SUPPORT / "vllm_runner.py"), "--model", model,
               "--prompts", json.dumps(PROMPTS), "--phases", phases, "--max-tokens", "8"]
        if config is not None:
            cmd += ["--kvtier-config", str(config)]
        super().__init__(cmd, workdir, workdir / "engine.log", engine_env())


def runs(result: dict[str, Any], phase: int, field: str) -> dict[str, Any]:
    return {r["prompt"]: r[field] for r in result["phases"][phase]["runs"]}


def disk(result: dict[str, Any], phase: int) -> dict[str, Any]:
    (local,) = result["phases"][phase]["local"]
    stats: dict[str, Any] = local["chain"]["disk"]
    return stats


@needs_vllm
@pytest.mark.timeout(900)
def test_an_engine_starts_and_serves_over_a_damaged_pool_index(
        model_dir: str, tmp_path: Path) -> None:
    root = tmp_path / "shared"
    # load_policy always: on a busy machine a read of the disk tier can take longer than
    # the tiny model's recompute of its tokens, and the load decision then declines the
    # later prompts' blocks, rightly; what this test checks is that they are served
    config = write_yaml(tmp_path / "tiers.yaml", [host_tier(), {
        "name": "disk", "backend": "fs", "url": str(root), "capacity": "64MiB"}],
        load_policy="always")
    phases = f"warm;{','.join(NAMES)}"
    engines = {"base": Engine(tmp_path / "base", model_dir, ",".join(NAMES), None),
               "a": Engine(tmp_path / "a", model_dir, phases, config)}
    try:
        a = engines["a"].result()
        index = root / DB_NAME
        assert index.is_file() and disk(a, 1)["puts"] == 3 * BLOCKS
        index.write_bytes(random.Random(1).randbytes(max(index.stat().st_size, 8192)))
        engines["b"] = Engine(tmp_path / "b", model_dir, phases, config)
        b = engines["b"].result()
        baseline = runs(engines["base"].result(), 0, "ids")
    finally:
        for engine in engines.values():
            engine.kill()
    log = (tmp_path / "b" / "engine.log").read_text()
    assert f"the index {index} is damaged" in log, log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    # the damaged file was moved aside, and the name points at the index built anew
    assert (root / (DB_NAME + ".damaged")).read_bytes()[:16] != b"SQLite format 3\0"
    assert os.path.realpath(index) != str(index)
    # outputs as without offloading; B's RAM tier started empty: every block from disk
    assert runs(a, 1, "ids") == runs(b, 1, "ids") == baseline
    assert runs(b, 1, "num_cached_tokens") == {name: CACHED for name in NAMES}
    # every block read once, any one-block reads that measured the disk tier included
    assert disk(b, 1)["probes"] <= 2 and disk(b, 1)["declined"] == 0
    assert 3 * BLOCKS <= disk(b, 1)["hits"] <= 3 * BLOCKS + disk(b, 1)["probes"]
    assert disk(b, 1)["healthy"] and disk(b, 1)["errors"] == 0 and disk(b, 1)["corrupt"] == 0
