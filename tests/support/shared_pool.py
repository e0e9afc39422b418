"""Two vLLM engine processes as two nodes sharing one lower tier (a harness for tests).

Each node's chain is its own host tier (vLLM's CPU tier), its own local ``fs``
tier, then the shared tier, written through::

    node A: host -> fs (A's dir) -> shared
    node B: host -> fs (B's dir) -> shared

The shared tier is a parameter, a tier entry as in a kvtier YAML file (the
``object`` tier on a SeaweedFS cluster, a Redis Cluster tier, ...), so the
same harness runs on every engine.  :func:`run_two_nodes` runs node A on the
prompts, waits for it to exit (its chain flushes what it wrote through),
then starts node B, a fresh process with an empty fs tier, on the same
prompts.  Engine runs are ``vllm_runner.py`` processes, single-process mode,
so each result carries the chain's per-tier stats from inside the engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["HOST_BYTES", "NodeRun", "build_tiny_model", "node_chain", "run_node", "run_two_nodes"]

_HERE = Path(__file__).resolve().parent
HOST_BYTES = 16 << 20  # vLLM's CPU tier per node: far more than the prompts need


def _script(name: str) -> Path:
    """A test script, beside this module or one folder up (the layout is moving)."""
    for folder in (_HERE, _HERE.parent):
        if (folder / name).exists():
            return folder / name
    raise FileNotFoundError(name)


def engine_env(multiprocess: bool = False) -> dict[str, str]:
    """vLLM on the CPU, offline, telemetry off; the engine in the runner's own process
    unless ``multiprocess`` (then the chain's stats do not come back with the result)."""
    env = dict(os.environ)
    env.update({
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocess else "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    })
    return env


def build_tiny_model(out: Path) -> str:
    """The tests' tiny random Llama (2 layers, head_dim 32), written to ``out``."""
    subprocess.run([sys.executable, str(_script("make_tiny_llama.py")), str(out)], check=True,
                   capture_output=True, env=engine_env(), timeout=600)
    return str(out)


def node_chain(node_dir: Path, shared: dict[str, Any]) -> list[dict[str, Any]]:
    """A node's tiers: host, its own fs directory, then ``shared`` written through."""
    return [
        {"name": "ram", "backend": "host", "capacity": HOST_BYTES},
        {"name": "disk", "backend": "fs", "url": f"file://{node_dir / 'disk'}"},
        {**shared, "write": "through"},
    ]


@dataclass
class NodeRun:
    """One engine process's outcome: outputs, cached tokens, per-tier stats, seconds."""

    result: dict[str, Any]
    seconds: float
    log: Path

    def outputs(self) -> dict[str, list[int]]:
        return {r["prompt"]: r["ids"] for r in self.result["phases"][0]["runs"]}

    def cached(self) -> dict[str, int]:
        return {r["prompt"]: r["num_cached_tokens"] for r in self.result["phases"][0]["runs"]}

    def tiers(self) -> dict[str, dict[str, Any]]:
        """The chain's per-tier stats in the engine (vLLM's CPU tier is the host tier)."""
        (local,) = self.result["phases"][0]["local"]
        tiers: dict[str, dict[str, Any]] = local["chain"]
        return tiers

    def namespace(self) -> str:
        (local,) = self.result["phases"][0]["local"]
        return str(local["namespace"])


def run_node(node_dir: Path, model: str, prompts: dict[str, list[int]],
             shared: dict[str, Any], *, max_tokens: int = 8, timeout: float = 600) -> NodeRun:
    """One engine process on ``prompts`` (greedy, one after the other) with a node chain."""
    node_dir.mkdir(parents=True, exist_ok=True)
    config = node_dir / "tiers.yaml"
    config.write_text(yaml.safe_dump({"chain": node_chain(node_dir, shared)}, sort_keys=False))
    log = node_dir / "engine.log"
    started = time.monotonic()
    with open(log, "w") as stderr:
        proc = subprocess.run(
            [sys.executable, str(_script("vllm_runner.py")), "--model", model,
             "--prompts", json.dumps(prompts), "--kvtier-config", str(config),
             "--max-tokens", str(max_tokens)],
            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=node_dir,
            env=engine_env(), timeout=timeout, check=False,
        )
    seconds = time.monotonic() - started
    tag = "KVTIER-RUNNER RESULT "
    lines = [line for line in proc.stdout.splitlines() if line.startswith(tag)]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"engine in {node_dir} exited {proc.returncode}:\n"
                             f"{proc.stdout[-2000:]}\n{log.read_text()[-4000:]}")
    return NodeRun(json.loads(lines[-1][len(tag):]), seconds, log)


def run_two_nodes(base: Path, model: str, prompts: dict[str, list[int]],
                  shared: dict[str, Any], **kwargs: Any) -> tuple[NodeRun, NodeRun]:
    """Node A on ``prompts``, then, once A has exited, node B (fresh, empty fs) on them."""
    first = run_node(base / "node-a", model, prompts, shared, **kwargs)
    second = run_node(base / "node-b", model, prompts, shared, **kwargs)
    return first, second
