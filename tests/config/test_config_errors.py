"""kvtier.config's validation errors, with file:line and key: in the YAML itself and in a tier."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_fakes import EXAMPLE, FakeHost, fails, write

from kvtier.config import load_config
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import ConfigError, Option, PluginError

# -- YAML-level errors ---------------------------------------------------------


def test_yaml_syntax_error_has_line(tmp_path: Path, registry: BackendRegistry) -> None:
    path = write(tmp_path, "chain:\n  - name: ram\n    backend: [host\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, registry=registry)
    assert info.value.where is not None and info.value.where.startswith(f"{path}:")
    assert "invalid YAML" in info.value.reason
    path = write(tmp_path, "chain:\n  - name: ram\n  backend: host\n")
    fails(path, registry, f"{path}:3", None, "invalid YAML")


def test_empty_file(tmp_path: Path, registry: BackendRegistry) -> None:
    path = write(tmp_path, "# only a comment\n")
    fails(path, registry, f"{path}:1", None, "empty")


def test_missing_file(tmp_path: Path, registry: BackendRegistry) -> None:
    path = str(tmp_path / "nope.yaml")
    fails(path, registry, path, None, "cannot read")


def test_not_utf8(tmp_path: Path, registry: BackendRegistry) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_bytes(b"chain:\n  - name: \xff\n")
    fails(str(path), registry, f"{path}:2", None, "UTF-8")


def test_top_level_not_mapping(tmp_path: Path, registry: BackendRegistry) -> None:
    path = write(tmp_path, "- name: ram\n  backend: host\n")
    fails(path, registry, f"{path}:1", None, "expected a mapping with a 'chain' list, got a list")


def test_unknown_top_level_key(tmp_path: Path, registry: BackendRegistry) -> None:
    path = write(tmp_path, EXAMPLE + "metric:\n  prometheus_port: 1\n")
    err = fails(path, registry, f"{path}:12", "metric", "unknown key 'metric'")
    assert "did you mean 'metrics'?" in err.reason
    assert "chain, metrics, version" in err.reason


@pytest.mark.parametrize(
    ("text", "line", "key", "fragment"),
    [
        ("version: 1\n", 1, None, "missing required key 'chain'"),
        ("chain: []\n", 1, "chain", "expected a non-empty list of tiers, got an empty list"),
        ("chain:\n", 1, "chain", "got nothing"),
        ("chain: {a: 1}\n", 1, "chain", "got a mapping"),
        ("version: 2\n" + EXAMPLE, 1, "version", "unsupported configuration version 2"),
        ("version: true\n" + EXAMPLE, 1, "version", "expected an integer, got bool True"),
        (EXAMPLE + "metrics: 3\n", 12, "metrics", "expected a mapping, got int 3"),
        (EXAMPLE + "metrics:\n  port: 1\n", 13, "metrics.port", "unknown key 'port'"),
        (EXAMPLE + "metrics:\n  prometheus_port: 0\n", 13, "metrics.prometheus_port",
         "1..65535"),
        (EXAMPLE + "metrics:\n  prometheus_port: '80'\n", 13, "metrics.prometheus_port",
         "expected an integer, got '80'"),
        (EXAMPLE + "metrics:\n  log_interval: soon\n", 13, "metrics.log_interval",
         "expected a duration such as 250ms"),
        (EXAMPLE + "metrics:\n  prometheus_host: ''\n", 13, "metrics.prometheus_host",
         "expected an address such as 127.0.0.1 or 0.0.0.0"),
    ],
)
def test_top_level_errors(tmp_path: Path, registry: BackendRegistry, text: str, line: int,
                          key: str | None, fragment: str) -> None:
    path = write(tmp_path, text)
    fails(path, registry, f"{path}:{line}", key, fragment)


def test_duplicate_yaml_keys(tmp_path: Path, registry: BackendRegistry) -> None:
    text = EXAMPLE.replace("    capacity: 500GiB\n", "    capacity: 500GiB\n    capacity: 1GiB\n")
    path = write(tmp_path, text)
    fails(path, registry, f"{path}:10", "chain[1].capacity",
          "duplicate key 'capacity' (first given on line 9)")
    path = write(tmp_path, EXAMPLE + "chain: []\n")
    fails(path, registry, f"{path}:12", "chain", "duplicate key 'chain'")


@pytest.mark.parametrize(
    ("snippet", "fragment"),
    [
        ("!!python/object:os.system {}", "unsupported YAML tag tag:yaml.org,2002:python/object"),
        ("!custom 8GiB", "unsupported YAML tag !custom"),
        ("!!binary aGVsbG8=", "unsupported YAML tag"),
        ("!!set {a: null}", "unsupported YAML tag"),
    ],
)
def test_rejects_tags(tmp_path: Path, registry: BackendRegistry, snippet: str,
                      fragment: str) -> None:
    path = write(tmp_path, EXAMPLE.replace("eviction: arc", f"eviction: {snippet}"))
    fails(path, registry, f"{path}:5", "chain[0].eviction", fragment)


def test_non_string_key_and_recursive_alias(tmp_path: Path, registry: BackendRegistry) -> None:
    path = write(tmp_path, EXAMPLE + "1: x\n")
    fails(path, registry, f"{path}:12", None, "mapping keys must be strings")
    path = write(tmp_path, EXAMPLE.replace("eviction: arc", "eviction: &a [*a]"))
    fails(path, registry, f"{path}:5", "chain[0].eviction[0]", "recursive alias")


def test_alias_bombs_and_recursive_merge(tmp_path: Path, registry: BackendRegistry) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 7)]
    path = write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="document too large"):
        load_config(path, registry=registry)
    path = write(tmp_path, "chain:\n  - &t\n    name: a\n    <<: *t\n")
    fails(path, registry, f"{path}:2", "chain[0]", "recursive alias")


# -- tier errors -----------------------------------------------------------------

TIER_ERRORS = [
    # (replace this, with that, line, key, fragment)
    ("  - name: nvme\n", "  - just-a-string\n  - name: nvme\n", 6, "chain[1]",
     "expected a tier mapping with 'name' and 'backend', got 'just-a-string'"),
    ("  - name: nvme\n    backend: fs\n", "  - backend: fs\n", 6, "chain[1].name",
     "missing required key 'name'"),
    ("    backend: fs\n", "", 6, "chain[1].backend", "missing required key 'backend'"),
    ("name: nvme", "name: ram", 6, "chain[1].name",
     "duplicate tier name 'ram' (already used by chain[0] at "),
    ("name: nvme", "name: nv/me", 6, "chain[1].name", "invalid tier name 'nv/me'"),
    ("name: nvme", "name: ''", 6, "chain[1].name", "invalid tier name ''"),
    ("name: nvme", "name: 7", 6, "chain[1].name", "expected a string, got int 7"),
    ("backend: fs", "backend: lmdb", 7, "chain[1].backend",
     "unknown backend 'lmdb' (installed: fs, host); it is provided by another "
     "package: pip install kvtier-lmdb"),
    ("capacity: 500GiB", "capcity: 500GiB", 9, "chain[1].capcity",
     "unknown key 'capcity'; did you mean 'capacity'? Accepted for backend 'fs': admit, "
     "admit_sample, backend, capacity, codec, encrypt, headers, name, paths, pin, promote, "
     "ratio, required, retries, sync, timeout, token, url, verify, workers, write"),
    ("capacity: 500GiB", "capacity: 5 bananas", 9, "chain[1].capacity",
     "expected a size such as 8GiB, 500MB or 4096 (bytes), got '5 bananas'"),
    ("capacity: 500GiB", "capacity: true", 9, "chain[1].capacity", "got bool True"),
    ("capacity: 500GiB", "capacity: -5", 9, "chain[1].capacity", "got int -5"),
    ("capacity: 500GiB", "retries: true", 9, "chain[1].retries",
     "expected an integer, got bool True"),
    ("capacity: 500GiB", "retries: 2.5", 9, "chain[1].retries", "got float 2.5"),
    ("capacity: 500GiB", "ratio: yes", 9, "chain[1].ratio", "expected a number, got bool True"),
    ("capacity: 500GiB", "sync: 1", 9, "chain[1].sync", "expected true or false, got int 1"),
    ("capacity: 500GiB", "timeout: forever", 9, "chain[1].timeout", "expected a duration"),
    ("capacity: 500GiB", "paths: {a: 1}", 9, "chain[1].paths",
     "expected a list (or one string of comma-separated items), got a mapping"),
    ("capacity: 500GiB", "headers: [a]", 9, "chain[1].headers", "expected a mapping, got a list"),
    ("url: file:///var/cache/kvtier", "url: s3://bucket", 8, "chain[1].url",
     "url must start with file:// or memory://"),
    ("url: file:///var/cache/kvtier", "url: [a]", 8, "chain[1].url",
     "expected a string, got a list"),
    ("    url: file:///var/cache/kvtier\n", "", 6, "chain[1].url",
     "missing required option of backend 'fs': Where blocks live"),
    ("eviction: arc", "eviction: fifo", 5, "chain[0].eviction",
     "expected one of 'lru', 'arc', got 'fifo'"),
    ("eviction: arc", "write: through", 5, "chain[0].write",
     "'write' has no meaning on the first tier"),
    ("write: back", "write: around", 11, "chain[1].write",
     "expected one of 'through', 'back', got 'around'"),
    ("codec: zstd", "codec: lz4", 10, "chain[1].codec", "expected one of 'none', 'zstd'"),
    ("codec: zstd", "codec_level: 23", 10, "chain[1].codec_level", "from -7 to 22, got 23"),
    ("codec: zstd", "codec_level: -8", 10, "chain[1].codec_level", "got -8"),
    ("codec: zstd", "codec_level: high", 10, "chain[1].codec_level", "expected an integer"),
    ("codec: zstd", "shuffle: 3", 10, "chain[1].shuffle",
     "expected 'auto' or an element size 0, 1, 2, 4 or 8"),
    ("codec: zstd", "shuffle: true", 10, "chain[1].shuffle", "got bool True"),
    ("codec: zstd", "shuffle: on", 10, "chain[1].shuffle", "got bool True"),
    ("codec: zstd", "workers: 0", 10, "chain[1].workers", "expected 1 to 64 threads, got 0"),
    ("codec: zstd", "workers: 65", 10, "chain[1].workers", "got 65"),
    ("codec: zstd", "promote: maybe", 10, "chain[1].promote", "expected true or false"),
    ("codec: zstd", "verify: 0", 10, "chain[1].verify", "expected true or false, got int 0"),
]


@pytest.mark.parametrize(("old", "new", "line", "key", "fragment"), TIER_ERRORS)
def test_tier_errors(tmp_path: Path, registry: BackendRegistry, old: str, new: str, line: int,
                     key: str, fragment: str) -> None:
    assert old in EXAMPLE
    path = write(tmp_path, EXAMPLE.replace(old, new, 1))
    fails(path, registry, f"{path}:{line}", key, fragment)


def test_unknown_backend_keeps_plugin_error_as_cause(tmp_path: Path,
                                                     registry: BackendRegistry) -> None:
    path = write(tmp_path, EXAMPLE.replace("backend: fs", "backend: lmdb"))
    err = fails(path, registry, f"{path}:7", "chain[1].backend", "pip install kvtier-lmdb")
    assert isinstance(err.__cause__, PluginError)


def test_backend_declaring_a_tier_key_is_a_plugin_error(tmp_path: Path) -> None:
    class Clash(FakeHost):
        OPTIONS = {"codec": Option("str", "clashes")}

    reg = BackendRegistry()
    reg.register("host", Clash)
    with pytest.raises(PluginError, match="codec"):
        load_config({"chain": [{"name": "a", "backend": "host"}]}, registry=reg)


def test_shuffle_values(registry: BackendRegistry) -> None:
    for value in ("auto", 0, 1, 2, 4, 8):
        cfg = load_config({"chain": [{"name": "a", "backend": "host", "capacity": 1,
                                      "shuffle": value}]}, registry=registry)
        assert cfg.tiers[0].shuffle == value
