"""``explain``: every effective setting of every tier and of the chain, with its source.

Against the fake backends of config_fakes: a value set in the file, a tier
key's default, a backend option's default, values substituted from the
environment (a secret among them, masked), a ``${VAR:-fallback}`` whose
variable is unset (the file's), and the chain's own keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from config_fakes import SECRET, FakeFs, FakeHost, write

from kvtier.config import Setting, explain, load_config
from kvtier.plugins.registry import BackendRegistry

TEXT = """\
chain:
  - name: ram
    backend: host
    capacity: 8GiB
  - name: nvme
    backend: fs
    url: file:///var/cache/kvtier
    token: ${TOKEN}
    retries: ${RETRIES}
    paths: [a, "${EXTRA}"]
    capacity: ${CAP:-2GiB}
    write: back
load_margin: 0.7
record: ${TRACE_DIR}/trace.jsonl
"""


@pytest.fixture
def rows(tmp_path: Path, registry: BackendRegistry,
         monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[Setting]]:
    for name, value in (("TOKEN", SECRET), ("RETRIES", "5"), ("EXTRA", "b"),
                        ("TRACE_DIR", "/var/log")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CAP", raising=False)
    path = write(tmp_path, TEXT)
    config = load_config(path, registry=registry)
    assert config.tiers[1].options["token"] == SECRET  # what the backend gets
    return path, explain(config, registry)


def by_key(rows: list[Setting]) -> dict[tuple[str, str], tuple[str, str, str | None,
                                                               tuple[str, ...]]]:
    table = {(r.tier, r.key): (r.value, r.source, r.where, r.variables) for r in rows}
    assert len(table) == len(rows)  # one row per setting
    return table


def test_each_source_value_and_line(rows: tuple[str, list[Setting]]) -> None:
    path, settings = rows
    got = by_key(settings)
    expected = {
        ("ram", "name"): ("ram", "file", f"{path}:2", ()),
        ("ram", "capacity"): ("8GiB", "file", f"{path}:4", ()),
        ("ram", "eviction"): ("lru", "default", None, ()),  # the backend's Option default
        ("ram", "max_block_size"): ("-", "default", None, ()),  # no default: unset
        ("ram", "codec"): ("none", "default", None, ()),  # a tier key's default
        ("ram", "write"): ("-", "default", None, ()),  # no meaning on the first tier
        ("nvme", "url"): ("file:///var/cache/kvtier", "file", f"{path}:7", ()),
        ("nvme", "token"): ("***", "env", f"{path}:8", ("TOKEN",)),
        ("nvme", "retries"): ("5", "env", f"{path}:9", ("RETRIES",)),
        ("nvme", "paths"): ("[a, b]", "env", f"{path}:10", ("EXTRA",)),
        # CAP is unset: the value is the file's fallback
        ("nvme", "capacity"): ("2GiB", "file", f"{path}:11", ()),
        ("nvme", "timeout"): ("2s", "default", None, ()),
        ("nvme", "pin"): ("-", "default", None, ()),
        ("nvme", "write"): ("back", "file", f"{path}:12", ()),
        ("nvme", "admit"): ("1", "default", None, ()),
        ("(chain)", "load_margin"): ("0.7", "file", f"{path}:13", ()),
        ("(chain)", "load_policy"): ("cost", "default", None, ()),
        ("(chain)", "record.path"): ("/var/log/trace.jsonl", "env", f"{path}:14", ("TRACE_DIR",)),
        ("(chain)", "record.sample"): ("1", "default", None, ()),
        ("(chain)", "metrics.prometheus_host"): ("127.0.0.1", "default", None, ()),
    }
    assert {k: got[k] for k in expected} == expected


def test_every_setting_of_every_tier_is_listed(rows: tuple[str, list[Setting]]) -> None:
    _, settings = rows
    tier_keys = ["name", "backend", "codec", "write", "promote", "verify", "workers", "admit",
                 "admit_sample", "required", "encrypt"]
    assert [r.key for r in settings if r.tier == "ram"] == [*tier_keys, *FakeHost.OPTIONS]
    assert [r.key for r in settings if r.tier == "nvme"] == [*tier_keys, *FakeFs.OPTIONS]
    chain = {r.key for r in settings if r.tier == "(chain)"}
    assert chain == {"load_policy", "recompute", "load_margin", "cost_half_life",
                     "record.path", "record.sample", "metrics.prometheus_port",
                     "metrics.prometheus_host", "metrics.log_interval",
                     "metrics.tenants_top", "metrics.tenants_interval"}
    assert {r.source for r in settings} == {"default", "file", "env"}


def test_secret_never_shown(rows: tuple[str, list[Setting]]) -> None:
    _, settings = rows
    assert SECRET not in repr(settings)
    assert SECRET not in json.dumps([r.as_json() for r in settings])


def test_secret_given_in_the_file_is_masked(tmp_path: Path, registry: BackendRegistry) -> None:
    path = write(tmp_path, TEXT.replace("${TOKEN}", SECRET).replace("${RETRIES}", "4")
                 .replace("${EXTRA}", "c").replace("${TRACE_DIR}", "/t"))
    got = by_key(explain(load_config(path, registry=registry), registry))
    assert got["nvme", "token"] == ("***", "file", f"{path}:8", ())
    assert got["nvme", "retries"] == ("4", "file", f"{path}:9", ())
    empty = write(tmp_path, TEXT.replace("${TOKEN}", '""').replace("${RETRIES}", "4")
                  .replace("${EXTRA}", "c").replace("${TRACE_DIR}", "/t"), "empty.yaml")
    got = by_key(explain(load_config(empty, registry=registry), registry))
    assert got["nvme", "token"] == ("", "file", f"{empty}:8", ())  # holds no secret


def test_merged_keys_name_the_anchor_line(tmp_path: Path, registry: BackendRegistry) -> None:
    path = write(tmp_path, """\
        chain:
          - &ram
            name: ram
            backend: host
            capacity: 1GiB
          - <<: *ram
            name: ram2
        """)
    got = by_key(explain(load_config(path, registry=registry), registry))
    assert got["ram2", "capacity"] == ("1GiB", "file", f"{path}:5", ())
    assert got["ram2", "name"] == ("ram2", "file", f"{path}:7", ())


def test_dict_source(registry: BackendRegistry) -> None:
    config = load_config({"chain": [{"name": "ram", "backend": "host", "capacity": 4097}],
                          "metrics": {"log_interval": "90s"}}, registry=registry)
    got = by_key(explain(config, registry))
    assert got["ram", "capacity"] == ("4097", "file", "<dict>", ())
    assert got["(chain)", "metrics.log_interval"] == ("90s", "file", "<dict>", ())
    assert got["(chain)", "metrics.prometheus_port"] == ("-", "default", None, ())
