"""Tenants of kvtier's vLLM tier (``KvtierTier``), driven as vLLM's scheduler drives it, with
vLLM's own ``ReqContext`` and ``TransferJob`` and a real host -> fs chain.

The real engine's test is tests/contrib/test_vllm_tenants.py; here each rule
is checked on its own: the same keys of two tenants, a lookup step mixing
them, a bad tenant name, the setting that ignores clients' tenants, a shared
tenant, and bad tenant options.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_chain import SpecStub, host_tier, write_yaml

from kvtier.spec import ConfigError

ROW = 4096
KEYS = [bytes([i]) * 36 for i in range(3)]


@pytest.fixture
def tier_factory(tmp_path: Path) -> Iterator[Any]:
    pytest.importorskip("vllm")
    from kvtier.contrib.vllm.tier import KvtierTier

    tiers: list[Any] = []

    def make(**kwargs: Any) -> tuple[Any, np.ndarray]:
        config = write_yaml(tmp_path / "tiers.yaml", [host_tier(), {
            "name": "disk", "backend": "fs", "url": str(tmp_path / "store")}])
        region = np.zeros((8, ROW), dtype=np.uint8)
        tier = KvtierTier(SpecStub(ROW, ("layers.0.attn", "layers.1.attn")),
                          memoryview(region), "KvtierTier", config=str(config), **kwargs)
        tiers.append(tier)
        return tier, region

    yield make
    for tier in tiers:
        tier.shutdown()


def ctx(tenant: Any = None, req_id: str | None = None) -> Any:
    from vllm.v1.kv_offload.base import ReqContext

    params = None if tenant is None else {"kvtier": {"tenant": tenant}}
    return ReqContext(req_id=req_id or f"r-{tenant}", kv_transfer_params=params)


def resolve(tier: Any, asks: list[tuple[bytes, Any]], timeout: float = 10.0) -> list[str]:
    """Answers to (key, request) lookups, as vLLM gets them: RETRY until the step's job is in."""
    from vllm.v1.kv_offload.base import LookupResult, ScheduleEndContext

    deadline = time.monotonic() + timeout
    while True:
        answers = [tier.lookup(k, c) for k, c in asks]
        if LookupResult.RETRY not in answers:
            return [a.name for a in answers]
        assert time.monotonic() < deadline
        tier.on_schedule_end(ScheduleEndContext((), ()))
        time.sleep(0.005)


def run_job(tier: Any, job_id: int, request: Any, chunks: list[int], load: bool,
            keys: list[bytes] = KEYS) -> Any:
    from vllm.v1.kv_offload.tiering.base import TransferJob

    job = TransferJob(job_id, keys, np.array(chunks, dtype=np.int32), load, request)
    (tier.submit_load if load else tier.submit_store)(job)
    deadline = time.monotonic() + 10
    while True:
        for res in tier.get_finished_jobs():
            if res.job_id == job_id:
                return res
        assert time.monotonic() < deadline, f"job {job_id} never finished"
        time.sleep(0.005)


def store(tier: Any, region: np.ndarray, request: Any, fill: int, job_id: int = 1) -> None:
    for c in range(3):
        region[c] = fill + c
    assert run_job(tier, job_id, request, [0, 1, 2], False).success


def test_tenants_with_the_same_keys_never_share_a_block(tier_factory: Any) -> None:
    tier, region = tier_factory()
    acme, globex = ctx("acme"), ctx("globex")
    store(tier, region, acme, 10)
    # one scheduler step asks for both tenants' keys: one lookup job, split by tenant
    assert resolve(tier, [(KEYS[0], acme), (KEYS[0], globex), (KEYS[1], acme),
                          (KEYS[1], globex)]) == ["HIT", "MISS", "HIT", "MISS"]
    # a load for globex of acme's keys reads nothing: the rows stay as they were
    region[4:7] = 0
    loaded = run_job(tier, 2, globex, [4, 5, 6], True)
    assert not loaded.success and not loaded.successful_keys
    assert not region[4:7].any()
    # globex stores its own blocks under the same keys; each tenant loads its own, exact
    store(tier, region, globex, 20, job_id=3)
    for request, fill, job_id in ((acme, 10, 4), (globex, 20, 5)):
        region[4:7] = 0
        assert run_job(tier, job_id, request, [4, 5, 6], True).success
        assert [int(region[c][0]) for c in (4, 5, 6)] == [fill, fill + 1, fill + 2]
        assert all((region[c] == region[c][0]).all() for c in (4, 5, 6))
    stats = tier.tenant_stats()
    assert sorted(stats) == ["acme", "default", "globex"]
    assert len({s["namespace"] for s in stats.values()}) == 3
    # the tier's own chain is the default tenant's: it holds none of them
    assert tier.chain.lookup(KEYS) == [None, None, None]
    assert tier.adapter_stats()["tenant_requests:named"] == 2


def test_a_bad_tenant_name_is_a_miss_and_a_log_line(
    tier_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tier, region = tier_factory()
    store(tier, region, ctx(None), 10)  # the default tenant's
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    for n, bad in enumerate(["../default", "", 42, "x" * 65, {"name": "default"}]):
        request = ctx(bad, req_id=f"bad-{n}")
        assert resolve(tier, [(k, request) for k in KEYS]) == ["MISS"] * 3
        assert not run_job(tier, 10 + n, request, [4, 5, 6], False).success
    assert tier.adapter_stats()["tenant_requests:refused"] == 5
    refusals = [r for r in caplog.records if "not a tenant name" in r.getMessage()]
    assert len(refusals) == 5  # one line per request, not per key
    assert sorted(tier.tenant_stats()) == ["default"]  # no chain opened for them
    assert resolve(tier, [(k, ctx(None)) for k in KEYS]) == ["HIT"] * 3


def test_an_engine_that_ignores_clients_tenants_uses_its_own(tier_factory: Any) -> None:
    gateway, region = tier_factory(tenant="globex", trust_client_tenant=False)
    spoof = ctx("acme")
    store(gateway, region, spoof, 30)  # claims acme: stored as globex
    assert gateway.adapter_stats()["tenant_requests:ignored"] == 1
    assert sorted(gateway.tenant_stats()) == ["globex"]
    trusting, _ = tier_factory()
    assert resolve(trusting, [(KEYS[0], ctx("acme")), (KEYS[0], ctx("globex")),
                              (KEYS[0], ctx(None))]) == ["MISS", "HIT", "MISS"]


def test_a_shared_tenant_is_the_default_tenants_namespace(tier_factory: Any) -> None:
    tier, region = tier_factory(shared_tenants=["public"])
    store(tier, region, ctx("public"), 40)
    assert resolve(tier, [(KEYS[0], ctx(None)), (KEYS[0], ctx("public")),
                          (KEYS[0], ctx("acme"))]) == ["HIT", "HIT", "MISS"]


@pytest.mark.parametrize("options", [{"tenant": "a/b"}, {"shared_tenants": ["ok", "no way"]},
                                     {"trust_client_tenant": "maybe"}])
def test_bad_tenant_options_stop_the_tier(tier_factory: Any, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        tier_factory(**options)


def test_vllm_args_carry_the_tenant_settings(tmp_path: Path) -> None:
    from kvtier.contrib.vllm import kv_transfer_config

    config = write_yaml(tmp_path / "t.yaml", [host_tier(), {
        "name": "disk", "backend": "fs", "url": str(tmp_path / "s")}])
    extra = kv_transfer_config(config, tenant="globex", trust_client_tenant=False)
    (tier,) = extra["kv_connector_extra_config"]["secondary_tiers"]
    assert (tier["tenant"], tier["trust_client_tenant"]) == ("globex", False)
    assert "tenant" not in kv_transfer_config(config)["kv_connector_extra_config"][
        "secondary_tiers"][0]
    with pytest.raises(ConfigError, match="tenant"):
        kv_transfer_config(config, tenant="no/slash")
