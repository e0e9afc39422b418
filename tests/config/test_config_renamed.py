"""Old keys still work for a release, warn naming the new key, and cannot contradict it.

Every old key ``settings_inventory.old_keys`` finds in the declarations
has a case here (a new one without a case fails the first test), loaded from a
file with the old key and with the new one: the backend (or the tier) gets the
same value both ways, and only the old key warns, naming the new one.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from settings_inventory import old_keys

from kvtier.config import explain, load_config
from kvtier.plugins.options import DeprecatedKey, check_options
from kvtier.plugins.registry import default_registry
from kvtier.policies.tenancy import Expiry
from kvtier.spec import ConfigError

HOST = {"name": "ram", "backend": "host", "capacity": "1MiB"}
FS = {"backend": "fs", "url": "memory://kvtier-renamed"}

#: (scope, old key) -> (backend's entry, old key's value, new key's value, what the tier
#: or backend reads, the value it reads)
CASES: dict[tuple[str, str], tuple[dict[str, Any], Any, Any, str, Any]] = {
    ("tier", "codec_level"): ({**FS, "codec": "zstd"}, 5, "zstd:5", "codec_level", 5),
    ("tier", "shuffle"): ({**FS, "codec": "zstd"}, 2, "zstd:shuffle=2", "shuffle", 2),
    ("fs", "io_threads"): ({**FS}, 7, 7, "io_threads", 7),
    ("fs", "pool"): ({**FS}, False, "process", "capacity_scope", "process"),
    ("fs", "pool_lease"): ({**FS}, "3s", "3s", "pool_lease", 3.0),
    ("object", "request_timeout"): ({"backend": "object", "bucket": "b"}, "7s", "7s",
                                    "request_timeout", 7.0),
    ("peer", "connections"): ({"backend": "peer", "peers": ["127.0.0.1:1"]}, 3, 3,
                              "connections", 3),
    ("peer", "request_timeout"): ({"backend": "peer", "peers": ["127.0.0.1:1"]}, "4s", "4s",
                                  "request_timeout", 4.0),
    ("redis", "max_connections"): ({"backend": "redis"}, 5, 5, "max_connections", 5),
    ("object", "max_age"): ({"backend": "object", "bucket": "b"}, "7s", "7s", "expire",
                            Expiry(after=7.0)),
}
#: The new key each old one names.
NEW = {("tier", "codec_level"): "codec", ("tier", "shuffle"): "codec",
       ("fs", "io_threads"): "concurrency", ("fs", "pool"): "capacity_scope",
       ("fs", "pool_lease"): "timeout", ("object", "request_timeout"): "timeout",
       ("peer", "connections"): "concurrency", ("peer", "request_timeout"): "timeout",
       ("redis", "max_connections"): "concurrency", ("object", "max_age"): "expire"}


def _load(tmp_path: Path, entry: dict[str, Any]) -> Any:
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump({"chain": [HOST, {"name": "low", **entry}]}))
    return load_config(path)


def test_every_old_key_has_a_case() -> None:
    assert old_keys() == {k: v for k, v in NEW.items() if k[0] in ("tier", "fs", "object",
                                                                    "peer", "redis")
                          and (k[0] == "tier" or k[0] in default_registry().names())}
    assert set(CASES) == set(NEW)


@pytest.mark.parametrize("case", sorted(CASES), ids="-".join)
def test_an_old_key_works_and_warns_naming_the_new_one(tmp_path: Path,
                                                        case: tuple[str, str]) -> None:
    scope, old = case
    if scope != "tier" and scope not in default_registry().names():
        pytest.skip(f"the {scope} backend is not installed")
    base, old_value, new_value, field, want = CASES[case]
    new = NEW[case]
    key = "codec" if scope == "tier" else new
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new key warns of nothing
        current = _load(tmp_path, {**base, key: new_value}).tiers[1]
    with pytest.warns(DeprecatedKey, match=rf"'{old}' is deprecated .* write '{new}'"):
        before = _load(tmp_path, {**base, old: old_value}).tiers[1]
    read = (lambda t: getattr(t, field)) if scope == "tier" else (lambda t: t.options[field])
    assert read(before) == read(current) == want
    # a caller that opens the backend itself (the kit, a test) is warned too
    if scope != "tier":
        declared = default_registry().options(scope)
        options = {k: v for k, v in base.items() if k != "backend"}
        with pytest.warns(DeprecatedKey, match=rf"'{old}'.*'{new}'"):
            checked = check_options(scope, declared, {**options, old: old_value})
        assert checked[field] == want


def test_explain_shows_an_old_key_s_value_under_the_new_key(tmp_path: Path) -> None:
    with pytest.warns(DeprecatedKey):
        config = _load(tmp_path, {"backend": "fs", "url": str(tmp_path / "s"),
                                  "io_threads": 9, "pool_lease": "2s"})
    rows = {(r.tier, r.key): r for r in explain(config)}
    assert (rows[("low", "concurrency")].value, rows[("low", "concurrency")].source) == ("9",
                                                                                        "file")
    assert rows[("low", "timeout")].value == "2s"
    assert ("low", "io_threads") not in rows and ("low", "pool_lease") not in rows


def _fs(tmp_path: Path, **options: Any) -> dict[str, Any]:
    return {"backend": "fs", "url": str(tmp_path / "s"), **options}


def test_pool_false_with_capacity_scope_pool_is_refused(tmp_path: Path) -> None:
    with pytest.warns(DeprecatedKey), pytest.raises(ConfigError) as refused:
        _load(tmp_path, _fs(tmp_path, capacity="1MiB", pool=False, capacity_scope="pool"))
    assert refused.value.key == "chain[1].pool"
    assert "pool: false contradicts capacity_scope: pool" in refused.value.reason
    # pool: true said what capacity_scope says now; pool: false what process says
    with pytest.warns(DeprecatedKey):
        same = _load(tmp_path, _fs(tmp_path, pool=True, capacity_scope="pool")).tiers[1]
    assert same.options["capacity_scope"] == "pool"
    with pytest.warns(DeprecatedKey):
        per_process = _load(tmp_path, _fs(tmp_path, pool=False, capacity_scope="namespace"))
    assert per_process.tiers[1].options["capacity_scope"] == "process"


def test_a_value_given_under_both_names_is_refused(tmp_path: Path) -> None:
    with pytest.warns(DeprecatedKey), pytest.raises(ConfigError) as refused:
        _load(tmp_path, _fs(tmp_path, io_threads=2, concurrency=3))
    assert refused.value.key == "chain[1].io_threads"
    assert "give only 'concurrency'" in refused.value.reason
    with pytest.warns(DeprecatedKey), pytest.raises(ConfigError) as twice:
        _load(tmp_path, _fs(tmp_path, codec="zstd:3", codec_level=4))
    assert "the level is given twice" in twice.value.reason


@pytest.mark.parametrize(("backend", "option", "value"), [
    ("fs", "create", False), ("host", "prefault", "1MiB"), ("object", "allow_http", True)])
def test_an_option_only_commands_set_warns_in_a_file_not_from_a_caller(
        tmp_path: Path, backend: str, option: str, value: Any) -> None:
    if backend not in default_registry().names():
        pytest.skip(f"the {backend} backend is not installed")
    base = {"fs": _fs(tmp_path), "host": {"backend": "host", "capacity": "4MiB"},
            "object": {"backend": "object", "bucket": "b"}}[backend]
    with pytest.warns(DeprecatedKey, match=rf"'{option}' is no setting of a file"):
        tier = _load(tmp_path, {**base, option: value}).tiers[1]
    assert tier.options[option] == (1 << 20 if option == "prefault" else value)
    options = {k: v for k, v in base.items() if k != "backend"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checked = check_options(backend, default_registry().options(backend),
                                {**options, option: value})
    assert checked[option] == tier.options[option]
