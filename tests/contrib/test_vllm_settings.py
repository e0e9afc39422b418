"""The settings kvtier gives vLLM (``kvtier.contrib.vllm``): the KV transfer config, its CPU
tier sized from the chain's host tier, and the ``vllm-args`` command."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from vllm_chain import HOST_BYTES, REPO, host_tier, write_yaml

from kvtier.spec import ConfigError

# --------------------------------------------------------------------------- settings


def test_kv_transfer_config_sizes_vllm_cpu_tier_from_host_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvtier.contrib.vllm import (
        SPEC_MODULE,
        SPEC_NAME,
        TIER_MODULE,
        TIER_TYPE,
        kv_transfer_config,
    )

    path = write_yaml(tmp_path / "tiers.yaml", [host_tier(), {
        "name": "disk", "backend": "fs", "url": str(tmp_path / "store")}])
    monkeypatch.chdir(tmp_path)
    config = json.loads(json.dumps(kv_transfer_config("tiers.yaml")))  # JSON-clean
    assert config["kv_connector"] == "OffloadingConnector"
    assert config["kv_role"] == "kv_both"
    extra = config["kv_connector_extra_config"]
    assert extra["spec_name"] == SPEC_NAME == "KvtierOffloadingSpec"
    assert extra["spec_module_path"] == SPEC_MODULE
    assert extra["cpu_bytes_to_use"] == HOST_BYTES
    assert extra["eviction_policy"] == "arc"
    assert extra["kvtier_config"] == str(path)  # absolute: the engine may run elsewhere
    assert extra["secondary_tiers"] == [
        {"type": TIER_TYPE, "module_path": TIER_MODULE, "config": str(path)}
    ]
    assert kv_transfer_config(path, cpu_bytes_to_use=1 << 20)[
        "kv_connector_extra_config"]["cpu_bytes_to_use"] == 1 << 20


def test_vllm_args_command_prints_flag_and_python(tmp_path: Path) -> None:
    from kvtier.contrib.vllm import vllm_args_command

    path = write_yaml(tmp_path / "tiers.yaml", [host_tier(), {
        "name": "disk", "backend": "fs", "url": str(tmp_path / "store")}])
    result = CliRunner().invoke(vllm_args_command, [str(path)])
    assert result.exit_code == 0, result.output
    flag = next(line for line in result.output.splitlines()
                if line.startswith("--kv-transfer-config "))
    config = json.loads(flag.split(" ", 1)[1].strip("'"))
    extra = config["kv_connector_extra_config"]
    assert extra["spec_name"] == "KvtierOffloadingSpec"
    assert extra["spec_module_path"] == "kvtier.contrib.vllm.spec"
    assert extra["cpu_bytes_to_use"] == HOST_BYTES
    assert "KVTransferConfig(" in result.output
    assert "kv_connector='OffloadingConnector'" in result.output
    code = result.output[result.output.index("from vllm.config"):]
    namespace: dict[str, Any] = {}
    exec(code.replace("from vllm.config import KVTransferConfig", ""),
         {"KVTransferConfig": lambda **kw: kw}, namespace)
    assert namespace["kv_transfer_config"] == config

    only = CliRunner().invoke(vllm_args_command, [str(path), "--format", "json"])
    assert json.loads(only.output) == config

    bad = write_yaml(tmp_path / "bad.yaml", [host_tier()])
    refused = CliRunner().invoke(vllm_args_command, [str(bad)])
    assert refused.exit_code == 2
    assert "only a host tier" in refused.output


def test_s3fifo_and_adaptive_host_tiers_run_kvtiers_policy_in_vllms_cpu_tier(
    tmp_path: Path,
) -> None:
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    from kvtier.contrib.vllm import complete_extra_config, kv_transfer_config
    from kvtier.contrib.vllm.args import CACHE_POLICY_MODULE
    from kvtier.contrib.vllm.cache_policy import POLICY_CLASSES

    disk = {"name": "disk", "backend": "fs", "url": str(tmp_path / "store")}
    for eviction, name in (("s3fifo", "S3FifoCachePolicy"), ("adaptive", "AdaptiveCachePolicy"),
                           ("lru", "lru"), ("arc", "arc")):
        path = write_yaml(tmp_path / f"{eviction}.yaml", [{**host_tier(), "eviction": eviction},
                                                          disk])
        extra = kv_transfer_config(path)["kv_connector_extra_config"]
        assert extra["eviction_policy"] == name
        module = extra.get("cache_policy_module_path")
        assert module == (CACHE_POLICY_MODULE if eviction in ("s3fifo", "adaptive") else None)
        cls = CachePolicyFactory.get_cache_policy_cls(name, module)
        assert cls is POLICY_CLASSES[eviction] or eviction in ("lru", "arc")
        # the short hand-written form gets the same two keys; an explicit policy wins alone
        short = complete_extra_config({"kvtier_config": str(path)})
        assert (short["eviction_policy"], short.get("cache_policy_module_path")) == (name, module)
        mine = complete_extra_config({"kvtier_config": str(path), "eviction_policy": "lru"})
        assert mine["eviction_policy"] == "lru" and "cache_policy_module_path" not in mine


def test_chain_without_host_tier_gets_default_primary_size(tmp_path: Path) -> None:
    from kvtier.contrib.vllm import (
        DEFAULT_PRIMARY_BYTES,
        complete_extra_config,
        secondary_chain_config,
    )

    path = write_yaml(tmp_path / "t.yaml", [{"name": "disk", "backend": "fs",
                                             "url": str(tmp_path / "s")}])
    extra = complete_extra_config({"kvtier_config": str(path)})
    assert extra["cpu_bytes_to_use"] == DEFAULT_PRIMARY_BYTES
    assert [t["type"] for t in extra["secondary_tiers"]] == ["KvtierTier"]
    assert [t.name for t in secondary_chain_config(path).tiers] == ["disk"]
    # explicit settings win; a listed tier is completed, not duplicated
    extra = complete_extra_config({"cpu_bytes_to_use": 5, "secondary_tiers": [
        {"type": "KvtierTier", "config": str(path), "lookup_timeout": 1}]})
    assert extra["cpu_bytes_to_use"] == 5
    assert extra["secondary_tiers"] == [{"type": "KvtierTier", "config": str(path),
                                         "lookup_timeout": 1,
                                         "module_path": "kvtier.contrib.vllm.tier"}]
    with pytest.raises(ConfigError, match="kvtier_config"):
        complete_extra_config({"secondary_tiers": [{"type": "KvtierTier"}]})
    # no kvtier YAML at all: vLLM's own tiering settings, untouched
    plain = {"cpu_bytes_to_use": 5, "secondary_tiers": [{"type": "fs", "root_dir": "/x"}]}
    assert complete_extra_config(plain) == plain


def test_readme_example_gives_vllm_a_32gib_cpu_tier(tmp_path: Path) -> None:
    from kvtier.contrib.vllm import kv_transfer_config
    from kvtier.plugins.registry import default_registry

    if "object" not in default_registry().names():
        pytest.skip("the object backend is not installed")
    readme = (REPO / "contrib" / "vllm" / "README.md").read_text()
    (example,) = re.findall(r"```yaml\n(.*?)```", readme, flags=re.S)
    path = tmp_path / "tiers.yaml"
    path.write_text(example)
    extra = kv_transfer_config(path)["kv_connector_extra_config"]
    assert extra["cpu_bytes_to_use"] == 32 << 30 and extra["eviction_policy"] == "arc"


# --------------------------------------------------------------------------- finite numbers
# vLLM reads --kv-transfer-config with json.loads, which takes NaN and Infinity


@pytest.mark.parametrize("name", ["lookup_timeout", "verdict_ttl", "failed_ttl",
                                  "reopen_interval"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, "soon", None])
def test_secondary_tier_seconds_are_finite(name: str, value: object) -> None:
    from kvtier.contrib.vllm.tier_options import TierOptions

    given: dict[str, Any] = {"lookup_timeout": 2.0, "verdict_ttl": 2.0, "failed_ttl": 30.0,
                             "reopen_interval": 30.0, name: value}
    with pytest.raises(ConfigError) as info:
        TierOptions.checked("KvtierTier", config="tiers.yaml", namespace_extra=None,
                            model_name=None, keep_host_tier=False, job_workers=8,
                            locality=None, load_timeout=None, **given)
    assert str(info.value) == (f"secondary tier 'KvtierTier': {name!r}: expected a finite "
                               f"number of seconds, 0 or more, got {value!r}")
    ok = TierOptions.checked("KvtierTier", config="tiers.yaml", namespace_extra=None,
                             model_name=None, keep_host_tier=False, job_workers=8,
                             locality=None, load_timeout=None, **{**given, name: "0.5"})
    assert getattr(ok, name) == 0.5


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1.5, -1])
def test_cpu_bytes_are_a_whole_finite_count(tmp_path: Path, value: float) -> None:
    from kvtier.contrib.vllm import complete_extra_config, kv_transfer_config

    path = write_yaml(tmp_path / "t.yaml", [host_tier(), {"name": "disk", "backend": "fs",
                                                          "url": str(tmp_path / "s")}])
    with pytest.raises(ConfigError) as info:
        kv_transfer_config(path, cpu_bytes_to_use=value)
    assert info.value.key == "cpu_bytes_to_use"
    if value != value or value in (float("inf"),):  # NaN, Infinity: refused when given too
        with pytest.raises(ConfigError, match="whole number of bytes"):
            complete_extra_config({"kvtier_config": str(path), "cpu_bytes_to_use": value})
    assert kv_transfer_config(path, cpu_bytes_to_use=4096.0)[
        "kv_connector_extra_config"]["cpu_bytes_to_use"] == 4096
