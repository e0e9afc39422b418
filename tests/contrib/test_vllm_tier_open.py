"""A vLLM engine whose ``object`` tier's endpoint is down at start starts, serves, and uses
that tier once the endpoint comes up.

One engine (``vllm_runner.py``, vLLM's CPU build, the tiny random Llama) runs
the chain fs -> object, the object tier's endpoint a SeaweedFS whose ports
are chosen but which is not started: it refuses connections.  The chain
opens with the object tier failed, and the fs tier serves from the start
(before, the whole chain failed to open and vLLM ran without it until it
reopened, ``reopen_interval`` later).  While the engine is paused the test
starts SeaweedFS, and waits until the engine's object tier has opened (its
namespace descriptor appears in the bucket); the blocks stored next reach
the object tier, and, once the fs tier's files are gone, they are loaded
from it.  Greedy outputs are those of an engine without offloading.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from runner_process import RunnerProcess
from seaweed import SeaweedServer
from shared_pool import engine_env
from vllm_chain import host_tier, write_yaml

from kvtier import open_chain
from kvtier.chain.catalog import CATALOG, CATALOG_HEX

SUPPORT = Path(__file__).parents[1] / "support"
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)
BUCKET = "kvt-vllm-open"


def prompt(step: int, start: int) -> list[int]:
    """132 tokens: 4 full blocks of 32 (what the tiers store) and 4 more."""
    return [(i * step + start) % 500 + 3 for i in range(132)]


PROMPTS = {"p1": prompt(37, 11), "p2": prompt(53, 7), "p3": prompt(71, 5)}
PHASES = "p1,p2;p1,p3;p3"
BLOCKS, CACHED = 4, 128  # full blocks per prompt, tokens a tier can serve


class Engine(RunnerProcess):
    def __init__(self, workdir: Path, model: str, phases: str, config: Path | None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(SUPPORT / "vllm_runner.py"), "--model", model,
               "--prompts", json.dumps(PROMPTS), "--phases", phases, "--max-tokens", "8"]
        if config is not None:
            cmd += ["--kvtier-config", str(config), "--pause", "--reset-between"]
        super().__init__(cmd, workdir, workdir / "engine.log", engine_env())


def object_tier(server: SeaweedServer) -> dict[str, Any]:
    return {"name": "s3", "backend": "object", "bucket": BUCKET, "endpoint": server.endpoint,
            "access_key_id": server.access_key, "secret_access_key": server.secret_key,
            "region": server.region, "connect_timeout": "1s", "request_timeout": "5s"}


def described(server: SeaweedServer) -> bool:
    """Whether a namespace descriptor is in the bucket: what a chain records as its
    object tier opens."""
    with open_chain({"chain": [{**object_tier(server), "required": True}]},
                    namespace=CATALOG) as chain:
        return any(batch for batch in chain.tiers[0].scan(CATALOG_HEX))


def outputs(result: dict[str, Any], phase: int) -> dict[str, list[int]]:
    return {r["prompt"]: r["ids"] for r in result["phases"][phase]["runs"]}


def cached(result: dict[str, Any], phase: int) -> dict[str, int]:
    return {r["prompt"]: r["num_cached_tokens"] for r in result["phases"][phase]["runs"]}


def tier(result: dict[str, Any], phase: int, name: str) -> dict[str, Any]:
    (local,) = result["phases"][phase]["local"]
    stats: dict[str, Any] = local["chain"][name]
    return stats


@needs_vllm
@pytest.mark.timeout(900)
def test_engine_starts_with_its_object_tier_down_and_uses_it_once_it_is_up(
    model_dir: str, tmp_path: Path
) -> None:
    server = SeaweedServer(tmp_path / "weed")  # ports chosen, not started: refuses
    store = tmp_path / "store"
    # load_policy always: on a busy machine a read of the disk tier can take longer than
    # the tiny model's recompute of a block, and the load decision then rightly declines
    # it; what this test checks is that the engine starts and serves, not the decision
    config = write_yaml(tmp_path / "tiers.yaml", [
        host_tier(), {"name": "disk", "backend": "fs", "url": str(store)}, object_tier(server)],
        load_policy="always")
    engines = {"base": Engine(tmp_path / "base", model_dir, "p1,p2,p3", None),
               "kv": Engine(tmp_path / "kv", model_dir, PHASES, config)}
    try:
        assert engines["kv"].until("PAUSED").strip() == "1"
        server.repick_taken_ports()  # the engines took ports meanwhile; S3's is kept
        server.start()
        server.make_bucket(BUCKET)
        deadline = time.monotonic() + 120  # the engine retries after at most 30 s
        while not described(server):
            assert time.monotonic() < deadline, "the engine's object tier never opened"
            time.sleep(0.5)
        engines["kv"].resume()
        assert engines["kv"].until("PAUSED").strip() == "2"
        # the fs tier's blocks go: what is loaded next comes from the object tier
        removed = [p for p in store.rglob("*.kvb") if CATALOG_HEX not in p.parts]
        for path in removed:
            path.unlink()
        engines["kv"].resume()
        kv = engines["kv"].result()
        baseline = outputs(engines["base"].result(), 0)
    finally:
        for engine in engines.values():
            engine.kill()
        server.kill()

    # phase 0: the engine started and served; the fs tier took every block, the
    # object tier was down (unhealthy, nothing stored)
    assert outputs(kv, 0) == {n: baseline[n] for n in ("p1", "p2")}
    assert tier(kv, 0, "disk")["puts"] == 2 * BLOCKS
    assert not tier(kv, 0, "s3")["healthy"] and tier(kv, 0, "s3")["puts"] == 0
    # phase 1 (vLLM's CPU tier reset): p1 from the fs tier; p3 stored through to S3
    assert outputs(kv, 1) == {n: baseline[n] for n in ("p1", "p3")}
    assert cached(kv, 1) == {"p1": CACHED, "p3": 0}
    assert tier(kv, 1, "s3")["healthy"] and tier(kv, 1, "s3")["puts"] == BLOCKS
    # phase 2: the fs files gone, p3 is loaded from the object tier
    assert len(removed) == 3 * BLOCKS
    assert outputs(kv, 2) == {"p3": baseline["p3"]}
    assert cached(kv, 2) == {"p3": CACHED}
    assert tier(kv, 2, "s3")["hits"] == BLOCKS and tier(kv, 2, "s3")["corrupt"] == 0
