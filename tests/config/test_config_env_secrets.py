"""kvtier.config's environment interpolation, and secret options kept out of every error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from config_fakes import EXAMPLE, SECRET, FakeFs, GiB, fails, write

from kvtier.config import load_config
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import ConfigError, Option

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
