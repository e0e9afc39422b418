"""Backend discovery through real entry points, and pluggy's validation of plugins.

The sample plugin in ``tests/support/kvtier-sample-plugin`` is a separate
distribution; it is pip-installed into a temporary directory put on
``sys.path`` (and ``PYTHONPATH`` for subprocesses), so its entry points are
found exactly as an installed third-party backend's would be.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvtier
from kvtier.plugins.registry import INSTALL_HINTS, BackendRegistry
from kvtier.spec import PluginError

PLUGIN_SRC = Path(__file__).parents[1] / "support" / "kvtier-sample-plugin"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(PLUGIN_SRC),
        ],
        check=True,
    )
    sys.path.insert(0, str(target))
    yield str(target)
    sys.path.remove(str(target))


def run_cli(
    *args: str, plugin_path: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": plugin_path, "COLUMNS": "250", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kvtier.cli", *args], capture_output=True, text=True, env=full_env
    )


def test_builtin_backends_come_from_the_same_entry_point_group() -> None:
    registry = BackendRegistry()
    assert {"host", "fs"} <= set(registry.names())
    info = registry.info("host")
    assert info.distribution == "kvtier" and info.version == kvtier.__version__
    assert info.value == "kvtier.backends.host:HostBackend"


def test_third_party_plugin_is_found_with_its_distribution(plugin_path: str) -> None:
    registry = BackendRegistry()
    assert "sample" in registry.names()
    info = registry.info("sample")
    assert (info.distribution, info.version) == ("kvtier-sample-plugin", "0.3.1")
    cfg = {"chain": [{"name": "s", "backend": "sample", "prefix": "p1"}]}
    with kvtier.open_chain(cfg, namespace="m", registry=registry) as chain:
        assert chain.put([b"k1"], [b"hello"]) == [True]
        out = [bytearray(5)]
        assert chain.get([b"k1"], out) == [True] and out[0] == b"hello"
        assert chain.tiers[0].capabilities.extra == {"prefix": "p1"}


def test_plugins_are_not_imported_until_needed(plugin_path: str) -> None:
    code = (
        "import sys, kvtier; from kvtier.plugins.registry import default_registry; "
        "default_registry().names(); print('kvtier_sample' in sys.modules, "
        "'kvtier.backends.host' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": plugin_path},
        check=True,
    )
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("sample-bad-param", "Argument(s) {'timeout'} are declared in the hookimpl"),
        ("sample-typo", "kvtier_gett is not a kvtier hook; did you mean kvtier_get?"),
        ("sample-unmarked", "kvtier_lookup is not marked with @kvtier.spec.hookimpl"),
        ("sample-missing", "does not implement required hook(s): kvtier_get, kvtier_lookup"),
        ("sample-import-error", "cannot be imported"),
    ],
)
def test_malformed_plugins_are_rejected_naming_the_plugin(
    plugin_path: str, name: str, message: str
) -> None:
    with pytest.raises(PluginError) as err:
        BackendRegistry().create(name)
    assert message in str(err.value)
    assert repr(name) in str(err.value)
    if name != "sample-import-error":
        assert "kvtier-sample-plugin 0.3.1" in str(err.value)


def test_unknown_backend_lists_installed_and_hints_packages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = BackendRegistry()
    with pytest.raises(PluginError, match=r"unknown backend 'nope' \(installed: .*fs.*host"):
        registry.create("nope")
    # a backend known to come from another distribution that is not installed here
    monkeypatch.setitem(INSTALL_HINTS, "lmdb", "pip install kvtier-lmdb")
    with pytest.raises(PluginError, match="pip install kvtier-lmdb"):
        registry.create("lmdb")


def test_disabled_plugins_are_hidden(plugin_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVTIER_DISABLE_PLUGINS", "sample, fs")
    registry = BackendRegistry()
    assert "sample" not in registry.names() and "fs" not in registry.names()
    with pytest.raises(PluginError, match="disabled by KVTIER_DISABLE_PLUGINS"):
        registry.create("sample")
    assert "host" in registry.names()


def test_cli_backends_lists_plugin_with_distribution(plugin_path: str) -> None:
    result = run_cli("backends", plugin_path=plugin_path)
    assert result.returncode == 0, result.stderr
    lines = {
        line.split("│")[1].strip(): line
        for line in result.stdout.splitlines()
        if line.count("│") > 3
    }
    assert "kvtier-sample-plugin 0.3.1" in lines["sample"]
    assert f"kvtier {kvtier.__version__}" in lines["host"]
    assert "capacity*:size" in lines["host"]
    hidden = run_cli("backends", plugin_path=plugin_path, env={"KVTIER_DISABLE_PLUGINS": "sample"})
    assert "kvtier-sample-plugin" not in hidden.stdout.replace("sample-", "")


def test_cli_version_names_the_contract() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvtier.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"kvtier {kvtier.__version__} (contract {kvtier.CONTRACT_VERSION})"


def test_entry_point_metadata_is_what_pyproject_declares() -> None:
    import importlib.metadata

    eps = {
        ep.name: ep.value
        for ep in importlib.metadata.entry_points(group="kvtier.backends")
        if ep.dist is not None and ep.dist.metadata["Name"] == "kvtier"
    }
    assert eps["host"] == "kvtier.backends.host:HostBackend"
    assert eps["fs"] == "kvtier.backends.fs:FsBackend"


def test_implements_names_optional_hooks_and_refuses_unknown_names() -> None:
    from kvtier.plugins import default_registry

    handle = default_registry().create("host")
    assert handle.implements("kvtier_put") and handle.implements("kvtier_scan")
    assert not handle.implements("kvtier_tamper")  # deprecated, and host has kit_tamper
    with pytest.raises(ValueError, match="not a kvtier hook"):
        handle.implements("kvtier_teleport")
