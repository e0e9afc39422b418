"""kvtier as vLLM's secondary KV tier, in the real engine on vLLM's CPU build.

Each run is a fresh process (``vllm_runner.py``), on a tiny random Llama built
for the module, and greedy outputs are compared with a run without any connector:

* instance 1 stores two prompts (chain: host -> fs [-> object on SeaweedFS]);
* a fresh multi-process engine on instance 1's fs directory serves both
  prompts from it; then, blocks damaged on disk, it rejects them, recomputes,
  and stores the recomputed blocks in their place, which serve a third pass;
* instance 2 (its own fs directory, same bucket) serves them from the object
  tier; then, S3 server stopped, it keeps answering correctly;
* with vLLM's KV events on, the scheduler takes one stored event per chunk stored.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runner_process import RunnerProcess
from shared_pool import engine_env
from vllm_chain import REPO, damage_blocks, host_tier, write_yaml

from kvtier.chain.catalog import CATALOG_HEX

SUPPORT = Path(__file__).parents[1] / "support"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
HAVE_OBJECT = (REPO / "backends" / "object" / "__init__.py").exists()
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed")

# 4 full blocks of 32 tokens and 4 more: 128 tokens can come from a tier
PROMPTS = {
    "p1": [(i * 37 + 11) % 500 + 3 for i in range(132)],
    "p2": [(i * 53 + 7) % 500 + 3 for i in range(132)],
    "p3": [(i * 71 + 5) % 500 + 3 for i in range(132)],
}
CACHED = 128


# --------------------------------------------------------------------------- engine runs


class Run(RunnerProcess):
    """One ``vllm_runner.py`` process with the module's prompts, started at once."""

    def __init__(self, tmp: Path, model: str, *, config: Path | None = None,
                 phases: str = "", multiprocess: bool = False, pause: bool = False,
                 kv_events: bool = False) -> None:
        cmd = [sys.executable, str(SUPPORT / "vllm_runner.py"), "--model", model,
               "--prompts", json.dumps(PROMPTS)]
        if config is not None:
            cmd += ["--kvtier-config", str(config)]
        if phases:
            cmd += ["--phases", phases]
        if pause:
            cmd += ["--pause", "--reset-between"]
        if kv_events:
            cmd += ["--kv-events"]
        super().__init__(cmd, tmp, tmp / f"run-{uuid.uuid4().hex[:8]}.log",
                         engine_env(multiprocess))


def outputs(result: dict[str, Any], phase: int = 0) -> dict[str, list[int]]:
    return {r["prompt"]: r["ids"] for r in result["phases"][phase]["runs"]}


def cached(result: dict[str, Any], phase: int = 0) -> dict[str, int]:
    return {r["prompt"]: r["num_cached_tokens"] for r in result["phases"][phase]["runs"]}


def metric(result: dict[str, Any], phase: int, name: str) -> float:
    return float(result["phases"][phase]["metrics"].get(name, 0))


class Stored:
    """Instance 1's chain and run."""

    def __init__(self, base: Path, config: Path, local_config: Path,
                 object_tier: dict[str, Any] | None, result: dict[str, Any],
                 stdout: str) -> None:
        self.base, self.config, self.local_config = base, config, local_config
        self.object_tier, self.result, self.stdout = object_tier, result, stdout


@pytest.fixture(scope="module")
def first_runs(
    model_dir: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[dict[str, list[int]], Stored]]:
    """Run together: a run without connector (the baseline), and instance 1 storing
    p1 and p2 in its chain: host -> fs [-> object on SeaweedFS, written through]."""
    base = tmp_path_factory.mktemp("instance1")
    chain = [host_tier(), {"name": "disk", "backend": "fs", "url": str(base / "store")}]
    object_tier = None
    if HAVE_OBJECT:
        server = request.getfixturevalue("s3_server")
        bucket = server.make_bucket(f"kvt-vllm-{uuid.uuid4().hex[:12]}")
        object_tier = {
            "name": "object", "backend": "object", "write": "through", "bucket": bucket,
            "endpoint": server.endpoint, "region": server.region,
            "access_key_id": server.access_key, "secret_access_key": server.secret_key,
            "allow_http": True, "connect_timeout": "1s", "request_timeout": "5s",
        }
        chain.append(object_tier)
    config = write_yaml(base / "tiers.yaml", chain, metrics={"log_interval": "1s"})
    local = write_yaml(base / "local.yaml", chain[:2])
    runs = [Run(tmp_path_factory.mktemp("baseline"), model_dir, phases="p1,p2,p3"),
            Run(base, model_dir, config=config, phases="p1,p2")]
    try:
        baseline = outputs(runs[0].result())
        stored = Stored(base, config, local, object_tier, runs[1].result(), runs[1].stdout)
        yield baseline, stored
    finally:
        for run in runs:
            run.kill()


@pytest.fixture(scope="module")
def baseline(first_runs: tuple[dict[str, list[int]], Stored]) -> dict[str, list[int]]:
    """Greedy outputs of p1, p2, p3 without any connector."""
    return first_runs[0]


@pytest.fixture(scope="module")
def stored(first_runs: tuple[dict[str, list[int]], Stored]) -> Stored:
    return first_runs[1]


@needs_vllm
@pytest.mark.timeout(900)
def test_instance_stores_prompts_in_the_chain(stored: Stored,
                                              baseline: dict[str, list[int]]) -> None:
    result = stored.result
    assert outputs(result) == {"p1": baseline["p1"], "p2": baseline["p2"]}
    assert cached(result) == {"p1": 0, "p2": 0}
    assert metric(result, 0, "store_keys{ok}") == 8  # 4 full chunks per prompt
    assert metric(result, 0, "written_bytes{disk}") > 0
    (local,) = result["phases"][0]["local"]  # read from the live tier in the engine process
    assert list(local["chain"]) == (["disk", "object"] if stored.object_tier else ["disk"])
    assert local["chain"]["disk"]["puts"] == 8
    blocks = list((stored.base / "store" / local["namespace"]).rglob("*.kvb"))
    assert len(blocks) == 8
    # metrics.log_interval: the chain's line reaches vLLM's log; the RAM tier is vLLM's
    # own CPU tier now, so the chain behind vLLM starts at "disk"
    lines = [line for line in stored.stdout.splitlines() if "kvtier [" in line]
    assert lines and all("disk:" in line and "ram:" not in line for line in lines)


@needs_vllm
@pytest.mark.timeout(900)
def test_fresh_multiprocess_engine_serves_from_kvtier_and_rejects_damage(
    stored: Stored, baseline: dict[str, list[int]], model_dir: str
) -> None:
    # instance 1 again, its local chain only: with the bucket behind the fs tier,
    # intact copies from S3 would stand in for the damaged blocks
    run = Run(stored.base, model_dir, config=stored.local_config,
              phases="p1,p2;p1,p2;p1,p2", multiprocess=True, pause=True)
    try:
        run.until("PAUSED")
        assert damage_blocks(stored.base / "store") == 8
        run.resume()
        run.until("PAUSED")
        run.resume()
        result = run.result()
    finally:
        run.kill()

    # phase 0: a new engine process; every full chunk came from the fs tier
    assert outputs(result, 0) == {"p1": baseline["p1"], "p2": baseline["p2"]}
    assert cached(result, 0) == {"p1": CACHED, "p2": CACHED}
    assert metric(result, 0, "hits{disk}") == 8
    assert metric(result, 0, "load_keys{ok}") == 8
    assert metric(result, 0, "corrupt_blocks{disk}") == 0
    # phase 1: vLLM's caches reset, blocks damaged on disk: rejected, recomputed
    assert outputs(result, 1) == {"p1": baseline["p1"], "p2": baseline["p2"]}
    assert cached(result, 1) == {"p1": 0, "p2": 0}
    assert metric(result, 1, "corrupt_blocks{disk}") >= 2
    assert metric(result, 1, "load_keys{failed}") >= 2
    assert metric(result, 1, "hits{disk}") == 8  # no damaged block was served
    assert metric(result, 1, "store_keys{ok}") == 8  # recomputed blocks replace them
    # phase 2: caches reset again; the replaced blocks serve both prompts
    assert outputs(result, 2) == {"p1": baseline["p1"], "p2": baseline["p2"]}
    assert cached(result, 2) == {"p1": CACHED, "p2": CACHED}
    # every damaged block left the chain: dropped when a read rejected it, or by
    # the adapter before the recomputed block was stored
    dropped = metric(result, 2, "dropped_keys{failed_load}")
    assert dropped + metric(result, 1, "corrupt_blocks{disk}") == 8
    assert metric(result, 2, "corrupt_blocks{disk}") == metric(result, 1, "corrupt_blocks{disk}")


@needs_vllm
@pytest.mark.skipif(not HAVE_OBJECT, reason="the object backend (backends/object/) is missing")
@pytest.mark.timeout(900)
def test_second_instance_shares_through_object_store_and_survives_its_outage(
    stored: Stored, baseline: dict[str, list[int]], model_dir: str,
    request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    server = request.getfixturevalue("s3_server")
    assert stored.object_tier is not None
    config = write_yaml(tmp_path / "tiers.yaml", [
        host_tier(),
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "store")},  # its own, empty
        stored.object_tier,
    ])
    run = Run(tmp_path, model_dir, config=config, phases="p1,p2;p1,p3", pause=True)
    try:
        run.until("PAUSED")
        server.stop()
        run.resume()
        result = run.result()
    finally:
        run.kill()
        server.start()

    # phase 0: instance 2 finds instance 1's blocks in the bucket
    assert outputs(result, 0) == {"p1": baseline["p1"], "p2": baseline["p2"]}
    assert cached(result, 0) == {"p1": CACHED, "p2": CACHED}
    (local,) = result["phases"][0]["local"]
    assert local["chain"]["object"]["hits"] == 8
    assert local["chain"]["disk"]["hits"] == 0
    assert local["adapter"]["load_keys:ok"] == 8
    # phase 1: S3 is down; p1 comes from the fs tier (promoted there in phase 0),
    # p3 is new: its lookups and stores to S3 fail, vLLM recomputes, nothing raises
    assert outputs(result, 1) == {"p1": baseline["p1"], "p3": baseline["p3"]}
    assert cached(result, 1) == {"p1": CACHED, "p3": 0}
    (local,) = result["phases"][1]["local"]
    assert local["chain"]["disk"]["hits"] == 4
    assert local["chain"]["object"]["errors"] >= 1


@needs_vllm
@pytest.mark.timeout(900)
def test_kv_events_report_the_blocks_the_chain_stores(model_dir: str, tmp_path: Path) -> None:
    """With vLLM's KV events on, vLLM's scheduler takes from the tier one stored
    event per chunk the chain stored (counted as vLLM takes them)."""
    config = write_yaml(tmp_path / "tiers.yaml", [
        host_tier(), {"name": "disk", "backend": "fs", "url": str(tmp_path / "store")}])
    run = Run(tmp_path, model_dir, config=config, phases="p1,p2", kv_events=True)
    try:
        result = run.result()
    finally:
        run.kill()
    # 4 full chunks per prompt, each reported once, none removed
    assert metric(result, 0, "store_keys{ok}") == 8
    assert metric(result, 0, "kv_events{stored}") == 8
    assert metric(result, 0, "kv_events{removed}") == 0
    blocks = [p for p in (tmp_path / "store").rglob("*.kvb") if CATALOG_HEX not in p.parts]
    assert len(blocks) == 8  # beside them, the catalog's record of the namespace
