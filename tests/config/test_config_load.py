"""kvtier.config loading what it should: the example, every key, YAML anchors, and a dict
source (with its errors); ``explain``'s rows are in test_config_explain.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from config_fakes import EXAMPLE, GiB, fails, write

from kvtier.config import TIER_KEYS, ChainConfig, MetricsConfig, load_config
from kvtier.plugins.registry import BackendRegistry, default_registry
from kvtier.spec import PluginError

# -- the example -------------------------------------------------------------


def test_example_loads(tmp_path: Path, registry: BackendRegistry) -> None:
    path = write(tmp_path, EXAMPLE)
    cfg = load_config(path, registry=registry)
    assert isinstance(cfg, ChainConfig)
    assert cfg.source == path
    assert cfg.metrics == MetricsConfig()
    ram, nvme = cfg.tiers
    assert (ram.name, ram.backend, ram.where) == ("ram", "host", f"{path}:2")
    assert dict(ram.options) == {"capacity": 8 * GiB, "eviction": "arc", "max_block_size": None}
    assert (ram.codec, ram.codec_level, ram.shuffle, ram.write) == ("none", 1, "auto", "through")
    assert (ram.promote, ram.verify, ram.workers) == (True, True, 2)
    assert ram.secret_options == frozenset()
    assert nvme.where == f"{path}:6"
    assert nvme.codec == "zstd" and nvme.write == "back"
    assert nvme.options["url"] == "file:///var/cache/kvtier"
    assert nvme.options["capacity"] == 500 * GiB
    assert nvme.options["timeout"] == 2.0 and nvme.options["retries"] == 3
    assert nvme.options["ratio"] == 0.9 and nvme.options["sync"] is False
    assert nvme.options["token"] is None
    assert nvme.secret_options == frozenset({"token", "pin"})
    with pytest.raises(TypeError):
        nvme.options["url"] = "x"  # type: ignore[index]


def test_pathlike_and_relative_path_kept_as_given(
    tmp_path: Path, registry: BackendRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, EXAMPLE.replace("500GiB", "lots"))
    monkeypatch.chdir(tmp_path)
    err = fails(Path("tiers.yaml"), registry, "tiers.yaml:9", "chain[1].capacity",
                "expected a size such as 8GiB")
    assert str(err).startswith("tiers.yaml:9: chain[1].capacity: expected a size such as 8GiB")


def test_real_default_registry_host_only(tmp_path: Path) -> None:
    try:
        default_registry().options("host")
    except PluginError as exc:
        pytest.skip(f"built-in host backend not available: {exc}")
    path = write(tmp_path, "\n".join(EXAMPLE.splitlines()[:5]) + "\n")
    cfg = load_config(path)
    (ram,) = cfg.tiers
    assert ram.backend == "host"
    assert ram.options["capacity"] == 8 * GiB and ram.options["eviction"] == "arc"


def test_all_tier_keys_and_metrics(tmp_path: Path, registry: BackendRegistry) -> None:
    path = write(tmp_path, """\
        version: 1
        chain:
          - {name: a, backend: host, capacity: 1024, promote: false, verify: false}
          - name: b.2_x-y
            backend: fs
            url: memory://x
            codec: zstd
            codec_level: -7
            shuffle: 4
            write: through
            workers: 64
            timeout: 250ms
            ratio: 1
            sync: true
            paths: [a, b]
            headers: {X-A: "1"}
        metrics:
          prometheus_port: 9400
          prometheus_host: 0.0.0.0
          log_interval: 1m
        """)
    cfg = load_config(path, registry=registry)
    a, b = cfg.tiers
    assert (a.promote, a.verify, a.options["capacity"]) == (False, False, 1024)
    assert (b.codec_level, b.shuffle, b.workers) == (-7, 4, 64)
    assert b.options["timeout"] == 0.25 and b.options["ratio"] == 1.0
    assert isinstance(b.options["ratio"], float)
    assert b.options["sync"] is True
    assert b.options["paths"] == ["a", "b"] and b.options["headers"] == {"X-A": "1"}
    assert cfg.metrics == MetricsConfig(prometheus_port=9400, log_interval=60.0,
                                        prometheus_host="0.0.0.0")
    assert {"name", "backend", "codec", "write", "workers", "shuffle"} <= TIER_KEYS


def test_anchor_and_merge_keys(tmp_path: Path, registry: BackendRegistry) -> None:
    path = write(tmp_path, """\
        chain:
          - &ram
            name: ram
            backend: host
            capacity: 1GiB
          - <<: *ram
            name: ram2
            capacity: 2GiB
        """)
    cfg = load_config(path, registry=registry)
    assert [t.name for t in cfg.tiers] == ["ram", "ram2"]
    assert cfg.tiers[1].options["capacity"] == 2 * GiB


# -- dict source --------------------------------------------------------------------


def test_dict_source(registry: BackendRegistry) -> None:
    cfg = load_config({
        "version": 1,
        "chain": (
            {"name": "ram", "backend": "host", "capacity": 8 * GiB, "promote": False},
            {"name": "nvme", "backend": "fs", "url": "file:///x", "capacity": "500GiB",
             "write": "back", "workers": 8, "timeout": 1, "codec": "zstd"},
        ),
        "metrics": {"prometheus_port": 9100, "log_interval": 5},
    }, registry=registry)
    assert cfg.source == "<dict>"
    ram, nvme = cfg.tiers
    assert ram.where == nvme.where == "<dict>"
    assert ram.options["capacity"] == 8 * GiB and ram.promote is False
    assert nvme.options["capacity"] == 500 * GiB and nvme.options["timeout"] == 1.0
    assert cfg.metrics == MetricsConfig(9100, 5.0)


@pytest.mark.parametrize(
    ("source", "key", "fragment"),
    [
        ([1, 2], None, "expected a mapping"),
        ({"chain": [{"name": "a", "backend": "host", "capacity": True}]}, "chain[0].capacity",
         "got bool True"),
        ({"chain": [{"name": "a", "backend": "host", "capacity": 1, "workers": True}]},
         "chain[0].workers", "expected an integer, got bool True"),
        ({"chain": [{"name": "a", "backend": "host", "capacity": 1, 5: 1}]}, "chain[0]",
         "mapping keys must be strings"),
        ({"chain": [{"name": "a", "backend": "host"}]}, "chain[0].capacity",
         "missing required option"),
        ({"chain": [{"name": "a", "backend": "nope"}]}, "chain[0].backend",
         "unknown backend 'nope'"),
        ({"chains": []}, "chains", "did you mean 'chain'?"),
    ],
)
def test_dict_source_errors(registry: BackendRegistry, source: Any, key: str | None,
                            fragment: str) -> None:
    fails(source, registry, "<dict>", key, fragment)
