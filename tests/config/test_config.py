"""Tests for kvtier.config: loading, validation errors with file:line and key, env, secrets."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from kvtier.config import TIER_KEYS, ChainConfig, MetricsConfig, describe, load_config
from kvtier.plugins.registry import INSTALL_HINTS, BackendRegistry, default_registry
from kvtier.spec import ConfigError, Option, PluginError, hookimpl

EXAMPLE = """\
chain:
  - name: ram
    backend: host
    capacity: 8GiB
    eviction: arc
  - name: nvme
    backend: fs
    url: file:///var/cache/kvtier
    capacity: 500GiB
    codec: zstd
    write: back
"""

GiB = 1024**3
SECRET = "hunter2-very-secret"


def _check_prefix(value: Any) -> None:
    if not str(value).startswith("file://") and not str(value).startswith("memory://"):
        raise ValueError("url must start with file:// or memory://")


def _check_token(value: Any) -> None:
    raise ValueError(f"token {value!r} is revoked")


class _Fake:
    OPTIONS: Mapping[str, Option] = {}

    @hookimpl
    def kvtier_options(self) -> Mapping[str, Option]:
        return self.OPTIONS

    @hookimpl
    def kvtier_put(self, keys: Sequence[bytes], blocks: Sequence[bytes]) -> list[bool]:
        return [True] * len(keys)

    @hookimpl
    def kvtier_get(self, keys: Sequence[bytes]) -> list[None]:
        return [None] * len(keys)

    @hookimpl
    def kvtier_lookup(self, keys: Sequence[bytes]) -> list[bool]:
        return [False] * len(keys)

    @hookimpl
    def kvtier_evict(self, keys: Sequence[bytes]) -> list[bool]:
        return [False] * len(keys)


class FakeHost(_Fake):
    OPTIONS = {
        "capacity": Option("size", "Byte capacity", required=True),
        "eviction": Option("str", "Eviction policy", default="lru", choices=("lru", "arc")),
        "max_block_size": Option("size", "Largest block"),
    }


class FakeFs(_Fake):
    OPTIONS = {
        "url": Option("str", "Where blocks live", required=True, check=_check_prefix),
        "capacity": Option("size", "Byte capacity", default="1GiB"),
        "timeout": Option("duration", "I/O timeout", default="2s"),
        "retries": Option("int", "Retries", default=3),
        "ratio": Option("float", "Fill ratio", default=0.9),
        "sync": Option("bool", "fsync", default=False),
        "paths": Option("list", "Extra paths"),
        "headers": Option("map", "Extra headers"),
        "token": Option("str", "Access token", secret=True),
        "pin": Option("str", "PIN", secret=True, check=_check_token),
    }


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> BackendRegistry:
    # only the fakes below: what else is installed (kvtier-redis, say) must not
    # change the messages checked here
    reg = BackendRegistry(group="kvtier.tests.no-entry-points")
    monkeypatch.setitem(INSTALL_HINTS, "lmdb", "pip install kvtier-lmdb")
    reg.register("host", FakeHost)
    reg.register("fs", FakeFs)
    return reg


def write(tmp_path: Path, text: str, name: str = "tiers.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def fails(source: Any, registry: BackendRegistry, where: str, key: str | None,
          fragment: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(source, registry=registry)
    err = info.value
    assert err.where == where, str(err)
    assert err.key == key, str(err)
    assert fragment in err.reason, str(err)
    assert str(err) == ": ".join(p for p in (where, key, err.reason) if p)
    return err


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
    assert cfg.metrics == MetricsConfig(prometheus_port=9400, log_interval=60.0)
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
     "unknown key 'capcity'; did you mean 'capacity'? Accepted for backend 'fs': backend, "
     "capacity, codec, codec_level, headers, name, paths, pin, promote, ratio, retries, "
     "shuffle, sync, timeout, token, url, verify, workers, write"),
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


# -- environment interpolation -------------------------------------------------


def test_env_interpolation(tmp_path: Path, registry: BackendRegistry,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAP", "8GiB")
    monkeypatch.setenv("CACHE_HOME", "/home/me")
    monkeypatch.setenv("WORKERS", "4")
    monkeypatch.setenv("RETRIES", "7")
    monkeypatch.setenv("SYNC", "true")
    monkeypatch.setenv("LEVEL", "-3")
    monkeypatch.setenv("SHUF", "8")
    monkeypatch.setenv("EMPTY", "")
    monkeypatch.delenv("UNSET_VAR", raising=False)
    path = write(tmp_path, """\
        chain:
          - name: ram
            backend: host
            capacity: ${CAP}
            eviction: ${UNSET_VAR:-arc}
            workers: ${WORKERS}
          - name: nvme-${EMPTY:-x}
            backend: fs
            url: file://${CACHE_HOME}/cache
            token: "pa$$word ${EMPTY}"
            retries: ${RETRIES}
            sync: ${SYNC}
            codec: zstd
            codec_level: ${LEVEL}
            shuffle: ${SHUF}
            paths: ["${CACHE_HOME}/a", $x]
        """)
    ram, nvme = load_config(path, registry=registry).tiers
    assert ram.options["capacity"] == 8 * GiB
    assert ram.options["eviction"] == "arc"
    assert ram.workers == 4
    assert nvme.name == "nvme-x"
    assert nvme.options["url"] == "file:///home/me/cache"
    assert nvme.options["token"] == "pa$word "
    assert nvme.options["retries"] == 7 and nvme.options["sync"] is True
    assert nvme.codec_level == -3 and nvme.shuffle == 8
    assert nvme.options["paths"] == ["/home/me/a", "$x"]
    assert type(nvme.options["url"]) is str and type(nvme.name) is str


def test_env_string_not_coerced_without_interpolation(registry: BackendRegistry) -> None:
    fails({"chain": [{"name": "a", "backend": "host", "capacity": 1, "workers": "4"}]},
          registry, "<dict>", "chain[0].workers", "expected an integer, got '4'")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("${NOPE_NOT_SET}", "environment variable NOPE_NOT_SET is not set"),
        ("file://${NOPE_NOT_SET}/x", "environment variable NOPE_NOT_SET is not set"),
        ("file://${oops", "unterminated '${'"),
        ("file://${1BAD}", "invalid variable reference ${1BAD}"),
    ],
)
def test_env_errors(tmp_path: Path, registry: BackendRegistry, monkeypatch: pytest.MonkeyPatch,
                    value: str, fragment: str) -> None:
    monkeypatch.delenv("NOPE_NOT_SET", raising=False)
    path = write(tmp_path, EXAMPLE.replace("url: file:///var/cache/kvtier", f"url: {value}"))
    fails(path, registry, f"{path}:8", "chain[1].url", fragment)


def test_env_value_parsed_after_interpolation(tmp_path: Path, registry: BackendRegistry,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAP", "huge")
    monkeypatch.setenv("WORKERS", "many")
    path = write(tmp_path, EXAMPLE.replace("capacity: 8GiB", "capacity: ${CAP}"))
    fails(path, registry, f"{path}:4", "chain[0].capacity", "got 'huge'")
    path = write(tmp_path, EXAMPLE.replace("eviction: arc", "workers: ${WORKERS}"))
    fails(path, registry, f"{path}:5", "chain[0].workers", "expected an integer, got 'many'")


# -- secrets ---------------------------------------------------------------------


def _secret_configs(tmp_path: Path) -> list[tuple[str, str, str]]:
    """(yaml text, key, reason fragment) that each fail on a secret option."""
    def tier(extra: str) -> str:
        return EXAMPLE.replace("    write: back\n", f"    write: back\n    {extra}\n")
    return [
        (tier(f"token: [{SECRET}]"), "chain[1].token", "value hidden: secret option"),
        (tier(f"token: {{a: {SECRET}}}"), "chain[1].token", "value hidden"),
        (tier(f"pin: {SECRET}"), "chain[1].pin", "details hidden: secret option"),
        (tier(f"pin: '{SECRET}${{x y}}'"), "chain[1].pin", "invalid variable reference;"),
        (tier(f"token: {SECRET}\n    tokne: {SECRET}"), "chain[1].tokne", "unknown key"),
        (tier(f"token: {SECRET}\n    token: {SECRET}"), "chain[1].token", "duplicate key"),
    ]


def test_secrets_never_in_errors(tmp_path: Path, registry: BackendRegistry,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for text, key, fragment in _secret_configs(tmp_path):
        path = write(tmp_path, text)
        with pytest.raises(ConfigError) as info:
            load_config(path, registry=registry)
        message = str(info.value)
        assert SECRET not in message and "hunter2" not in message, message
        assert info.value.key == key and fragment in message, message
    # the same, from the environment and through a dict source
    monkeypatch.setenv("PIN", SECRET)
    source = {"chain": [{"name": "a", "backend": "fs", "url": "memory://", "pin": "${PIN}"}]}
    with pytest.raises(ConfigError) as info:
        load_config(source, registry=registry)
    assert SECRET not in str(info.value)


def test_secret_check_reason_shown_when_value_absent(registry: BackendRegistry) -> None:
    class Fs(FakeFs):
        OPTIONS = {**FakeFs.OPTIONS,
                   "pin": Option("str", "PIN", secret=True, check=_check_length)}

    registry.register("fs", Fs)
    fails({"chain": [{"name": "a", "backend": "fs", "url": "memory://", "pin": SECRET}]},
          registry, "<dict>", "chain[0].pin", "must be 4 characters")


def _check_length(value: Any) -> None:
    if len(value) != 4:
        raise ValueError("must be 4 characters")


# -- describe ---------------------------------------------------------------------


def test_describe(tmp_path: Path, registry: BackendRegistry,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN", SECRET)
    text = EXAMPLE.replace("    write: back\n", "    write: back\n    token: ${TOKEN}\n"
                           "    paths: [a, b]\n    shuffle: 2\n    codec_level: 5\n")
    path = write(tmp_path, text)
    cfg = load_config(path, registry=registry)
    assert cfg.tiers[1].options["token"] == SECRET
    rows = describe(cfg)
    assert SECRET not in repr(rows)
    ram, nvme = rows
    assert ram == {
        "tier": "0", "name": "ram", "backend": "host",
        "options": f"capacity={8 * GiB}, eviction=arc",
        "codec": "none", "shuffle": "auto", "write": "-", "promote": "yes", "verify": "yes",
        "workers": "2", "where": f"{path}:2",
    }
    assert nvme["options"] == (
        f"url=file:///var/cache/kvtier, capacity={500 * GiB}, timeout=2.0, retries=3, "
        "ratio=0.9, sync=no, paths=[a, b], token=***"
    )
    assert (nvme["codec"], nvme["shuffle"], nvme["write"]) == ("zstd (level 5)", "2 bytes", "back")
    assert all(isinstance(v, str) for row in rows for v in row.values())


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
