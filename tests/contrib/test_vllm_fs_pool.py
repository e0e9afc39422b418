"""Two vLLM engines on one ``fs`` directory whose shared pool bounds them together.

Two engine processes (``vllm_runner.py``, vLLM's CPU build, the tiny random
Llama) run at the same time, each with the chain host -> fs, both fs tiers
on one directory with a ``capacity`` smaller than the blocks the two store
between them.  A thread of this process walks the directory all along and
adds up the bytes of every file there (block files, files being written,
everything but the pool's index): the largest total it sees stays within
the capacity, the bound docs/shared-capacity.md gives for a local root (room
is taken before a file is written, so nothing in flight overshoots).
Greedy outputs are those of an engine without offloading.  Then engine A
computes a new prompt, and engine B, its CPU tier reset, serves that prompt
from the blocks A left in the pool, with the same output.

With ``pool: false`` each process keeps the capacity on its own and the two
together hold up to twice it: the bound's assertion fails.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from runner_process import RunnerProcess
from shared_pool import engine_env
from vllm_chain import host_tier, write_yaml

from kvtier.backends.fs.pool import DB_NAME
from kvtier.chain.catalog import CATALOG_HEX

log = logging.getLogger("kvtier.tests")
SUPPORT = Path(__file__).parents[1] / "support"
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)


def prompt(step: int, start: int) -> list[int]:
    """132 tokens: 4 full blocks of 32 (what the tiers store) and 4 more."""
    return [(i * step + start) % 500 + 3 for i in range(132)]


PROMPTS = {
    "warm": [5, 6, 7],  # under one block: stores nothing
    "a1": prompt(37, 11), "a2": prompt(53, 7), "a3": prompt(71, 5),
    "b1": prompt(41, 13), "b2": prompt(59, 17), "b3": prompt(67, 19),
    "s": prompt(43, 23),
}
ROUND = {"a": ["a1", "a2", "a3"], "b": ["b1", "b2", "b3"]}
BLOCKS, CACHED = 4, 128  # full blocks per prompt, tokens a tier can serve
# one block of the test model: 2 layers x (K, V) x 32 tokens x 2 heads x 32 x float32
PAYLOAD = 2 * 2 * 32 * 2 * 32 * 4
FILE_MAX = PAYLOAD + 512  # the frame: the payload and a header far under 512 bytes
CAPACITY = 10 * FILE_MAX  # 10 blocks; the engines store 24 between them
POOL = True  # False: the bound's assertion fails (each process keeps its own capacity)


class Engine(RunnerProcess):
    """A ``vllm_runner.py`` process with the module's prompts, started at once, so
    several engines run together."""

    def __init__(self, workdir: Path, model: str, phases: str, config: Path | None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(SUPPORT / "vllm_runner.py"), "--model", model,
               "--prompts", json.dumps(PROMPTS), "--phases", phases, "--max-tokens", "8"]
        if config is not None:
            cmd += ["--kvtier-config", str(config), "--pause", "--reset-between"]
        super().__init__(cmd, workdir, workdir / "engine.log", engine_env())


class Sampler:
    """Walks ``root`` until stopped: the largest total of file bytes seen at once."""

    def __init__(self, root: Path) -> None:
        self.root, self.peak, self.samples = root, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def total(self) -> int:
        total = 0
        for folder, dirs, files in os.walk(self.root):
            if CATALOG_HEX in dirs:  # the chain's record of the namespace: not KV
                dirs.remove(CATALOG_HEX)
            for name in files:
                if name.startswith(DB_NAME):
                    continue  # the pool's index (docs/shared-capacity.md: not counted)
                with contextlib.suppress(FileNotFoundError):  # renamed or deleted since
                    total += os.stat(os.path.join(folder, name)).st_size
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.total())
            self.samples += 1
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.total())


def outputs(result: dict[str, Any], phase: int) -> dict[str, list[int]]:
    return {r["prompt"]: r["ids"] for r in result["phases"][phase]["runs"]}


def cached(result: dict[str, Any], phase: int) -> dict[str, int]:
    return {r["prompt"]: r["num_cached_tokens"] for r in result["phases"][phase]["runs"]}


def disk(result: dict[str, Any], phase: int) -> dict[str, Any]:
    """The fs tier's stats in the engine after ``phase`` (cumulative)."""
    (local,) = result["phases"][phase]["local"]
    stats: dict[str, Any] = local["chain"]["disk"]
    return stats


@needs_vllm
@pytest.mark.timeout(900)
def test_two_engines_share_one_fs_capacity(model_dir: str, tmp_path: Path) -> None:
    root = tmp_path / "shared"
    config = write_yaml(tmp_path / "tiers.yaml", [host_tier(), {
        "name": "disk", "backend": "fs", "url": str(root), "capacity": CAPACITY,
        "pool": POOL}])
    sampler = Sampler(root)  # from before the engines start until they are gone
    names = [n for n in PROMPTS if n != "warm"]
    engines = {"base": Engine(tmp_path / "base", model_dir, ",".join(names), None)}
    try:
        for side in ("a", "b"):
            engines[side] = Engine(tmp_path / side, model_dir,
                                   f"warm;{','.join(ROUND[side])};s", config)
        # round 1: both engines up, then both generate at the same time
        for side in ("a", "b"):
            assert engines[side].until("PAUSED").strip() == "1"
        for side in ("a", "b"):
            engines[side].resume()
        for side in ("a", "b"):
            assert engines[side].until("PAUSED").strip() == "2"
        # round 2: A computes and stores s, then B serves it from A's blocks in the pool
        engines["a"].resume()
        a = engines["a"].result()
        engines["b"].resume()
        b = engines["b"].result()
        baseline = outputs(engines["base"].result(), 0)
    finally:
        for engine in engines.values():
            engine.kill()
        sampler.stop()

    stored = disk(a, 2)["puts"] + disk(b, 1)["puts"]
    log.info("fs pool, two engines: peak %d bytes of files on disk, capacity %d, %d blocks "
             "of %d bytes stored, %d samples", sampler.peak, CAPACITY, stored, PAYLOAD,
             sampler.samples)
    assert (disk(a, 1)["puts"], disk(b, 1)["puts"]) == (12, 12)  # every block of round 1
    assert stored * PAYLOAD > 2 * CAPACITY  # the joint working set is over the capacity
    # the bound: never more block bytes on disk than the capacity, not even for a moment
    assert sampler.samples > 100
    assert 0 < sampler.peak <= CAPACITY, (sampler.peak, CAPACITY)
    # outputs as without offloading
    assert outputs(a, 1) == {n: baseline[n] for n in ROUND["a"]}
    assert outputs(b, 1) == {n: baseline[n] for n in ROUND["b"]}
    assert outputs(a, 2) == outputs(b, 2) == {"s": baseline["s"]}
    # s: computed by A, served to B from the pool (B's CPU tier was reset)
    assert cached(a, 2) == {"s": 0}
    assert cached(b, 2) == {"s": CACHED}
    # every block read once, the one-block reads that measured the tier included
    # (probes: b learned what recomputing costs in round 1, so round 2 weighs the
    # disk tier before loading from it, docs/load-policy.md): the load takes the
    # probed blocks from the probe, unless it came more than 10 s after its lookup
    probes = disk(b, 2)["probes"] - disk(b, 1)["probes"]
    assert probes <= 2
    assert BLOCKS <= disk(b, 2)["hits"] - disk(b, 1)["hits"] <= BLOCKS + probes
    assert disk(b, 2)["declined"] == 0  # a fast disk: loaded, not declined
    assert disk(b, 2)["corrupt"] == 0
    assert disk(b, 2)["puts"] == disk(b, 1)["puts"]  # nothing stored again
