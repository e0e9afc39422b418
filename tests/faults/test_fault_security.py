"""Security checks: no code execution on data, keys never become paths, secrets stay hidden.

The source scan walks the syntax tree of every module of the package, so a
word in a comment does not trip it but an aliased import or a call does.
"""

from __future__ import annotations

import ast
import logging
import os
from pathlib import Path

import pytest
from faultkit import Report, block_for, object_tier, read_exact
from seaweed import SeaweedServer

import kvtier
from kvtier.backends.fs.index import INDEX_NAME
from kvtier.chain.catalog import CATALOG_HEX
from kvtier.config import explain, load_config

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("sdk", "spec", "backends", "contrib")
BANNED_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle",
                  "jsonpickle"}
BANNED_CALLS = {"eval", "exec", "execfile", "input"}
SAFE_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}
YAML_LOADS = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load",
              "full_load_all"}
UNSAFE_LOADERS = {"Loader", "UnsafeLoader", "FullLoader", "CLoader", "CUnsafeLoader",
                  "CFullLoader"}


def findings(source: str, label: str) -> list[str]:
    """What a module does that could run code from data it reads."""
    out = []
    for node in ast.walk(ast.parse(source, label)):
        where = f"{label}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            out += [f"{where}: import {a.name}" for a in node.names
                    if a.name.split(".")[0] in BANNED_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
                BANNED_MODULES):
            out.append(f"{where}: from {node.module} import")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in BANNED_CALLS:
                out.append(f"{where}: {func.id}()")
            if isinstance(func, ast.Attribute) and func.attr in YAML_LOADS and isinstance(
                    func.value, ast.Name) and func.value.id == "yaml":
                loader = next((k.value for k in node.keywords if k.arg == "Loader"),
                              node.args[1] if len(node.args) > 1 else None)
                name = loader.attr if isinstance(loader, ast.Attribute) else getattr(
                    loader, "id", None)
                if name not in SAFE_LOADERS:
                    out.append(f"{where}: yaml.{func.attr} without SafeLoader")
            for keyword in node.keywords:
                if keyword.arg in ("allow_pickle", "shell") and not (
                        isinstance(keyword.value, ast.Constant) and not keyword.value.value):
                    out.append(f"{where}: {keyword.arg}=...")
        elif isinstance(node, ast.Attribute) and node.attr in UNSAFE_LOADERS and isinstance(
                node.value, ast.Name) and node.value.id == "yaml":
            out.append(f"{where}: yaml.{node.attr}")
    return out


def package_sources() -> list[Path]:
    files = []
    for top in PACKAGE_DIRS:
        for path in (ROOT / top).rglob("*.py"):
            if not any(part.startswith(".") or part == "build" for part in path.parts):
                files.append(path)
    return files


def test_package_source_runs_no_code_from_data(fault_report: Report) -> None:
    sources = package_sources()
    assert len(sources) > 20  # the scan really saw the package
    found = [f for path in sources
             for f in findings(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []
    fault_report.record("security_scan", "ci", files=len(sources), findings=len(found))


@pytest.mark.parametrize("snippet", [
    "import pickle", "import pickle as p", "from marshal import loads", "eval(x)", "exec(x)",
    "yaml.load(text)", "yaml.load(text, Loader=yaml.Loader)", "yaml.unsafe_load(t)",
    "yaml.full_load(t)", "numpy.load(f, allow_pickle=True)", "run(c, shell=True)",
    "x = yaml.UnsafeLoader",
])
def test_the_scan_catches_what_it_looks_for(snippet: str) -> None:
    assert findings(snippet, "snippet")


@pytest.mark.parametrize("snippet", ["yaml.load(t, Loader=yaml.SafeLoader)",
                                     "yaml.compose(t, Loader=yaml.SafeLoader)", "re.compile(x)",
                                     "# pickle is never used", "s = 'eval(x)'"])
def test_the_scan_lets_safe_code_pass(snippet: str) -> None:
    assert findings(snippet, "snippet") == []


HOSTILE_KEYS = [b"../../../../etc/kvtier-escape", b"/tmp/kvtier-absolute", b"..", b".",
                b"a/../../b", b"\x00nul", b"C:\\windows\\x", b"~root", b"%2e%2e%2f", b"\xff" * 64]


def test_keys_never_become_paths(tmp_path: Path) -> None:
    root = tmp_path / "inside" / "disk"
    config = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{root}"}]}
    blocks = [block_for(k, 100) for k in HOSTILE_KEYS]
    with kvtier.open_chain(config, namespace="paths") as chain:
        assert chain.put(HOSTILE_KEYS, blocks) == [True] * len(HOSTILE_KEYS)
        assert read_exact(chain, HOSTILE_KEYS, [100] * len(HOSTILE_KEYS)) == blocks
        namespace = chain.namespace.hex
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    # beside the blocks: the namespace's descriptor (kvtier.chain.catalog) and the
    # tier's index of each namespace (backends/fs/index.py)
    made = [p for p in files if CATALOG_HEX not in p.parts and p.name != INDEX_NAME]
    assert len(made) == len(HOSTILE_KEYS)
    assert sorted(p.name for p in files if p not in made) == sorted(
        [INDEX_NAME, INDEX_NAME, f"{namespace}.kvb"])
    for path in made:
        assert root in path.parents
        stem, _, suffix = path.name.partition(".")
        assert bytes.fromhex(stem) in HOSTILE_KEYS and suffix == "kvb", path  # key hex


def test_secrets_never_logged_or_shown(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    secret = "kvtier-Secret-" + os.urandom(8).hex()
    key_id = "kvtier-KeyId-" + os.urandom(4).hex()
    server = SeaweedServer(tmp_path / "weed", access_key=key_id, secret_key=secret)
    server.start()
    try:
        tier = object_tier(server, server.make_bucket("kvt-secrets"), request_timeout="1s",
                           connect_timeout="1s")
        caplog.set_level(logging.DEBUG)
        config = load_config({"chain": [tier]})
        shown = [str(explain(config))]
        with kvtier.open_chain(config, namespace="secrets") as chain:
            assert chain.put([b"k"], [b"v"]) == [True]
            server.kill()  # every request fails from here on, and is logged
            chain.put([b"k2"], [b"v"])
            read_exact(chain, [b"k"], [1])
            shown.append(repr(chain.stats()))
        required = load_config({"chain": [{**tier, "required": True}]})
        with pytest.raises(kvtier.spec.BackendError) as refused:  # open on a dead server
            kvtier.open_chain(required, namespace="secrets")
        shown.append(str(refused.value))
        with kvtier.open_chain(config, namespace="secrets") as started:  # starts failed
            shown.append(repr(started.stats()))
        server.start()
        wrong = {**tier, "secret_access_key": secret[::-1]}  # refused by the server
        with pytest.raises(kvtier.spec.BackendError) as denied:
            kvtier.open_chain({"chain": [{**wrong, "required": True}]}, namespace="secrets")
        shown.append(str(denied.value))
        with kvtier.open_chain({"chain": [wrong]}, namespace="secrets") as started:
            shown.append(repr(started.stats()))
    finally:
        server.kill()
    for bad in ({"secret_access_key": ["not", secret]}, {"access_key_id": {"x": secret}}):
        with pytest.raises(kvtier.spec.ConfigError) as info:
            load_config({"chain": [{**tier, **bad}]})
        shown.append(str(info.value))
    out = capsys.readouterr()
    everything = "\n".join([caplog.text, out.out, out.err, *shown])
    assert "failed in" in caplog.text  # the failures were logged: the check saw them
    assert secret not in everything and secret[::-1] not in everything
    assert key_id not in everything
