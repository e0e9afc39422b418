"""Docs and code keep each other honest: examples run, hooks documented, tables match."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import yaml

import kvtier
from kvtier.config import load_config
from kvtier.config.settings import TIER_OPTIONS
from kvtier.plugins.options import file_keys
from kvtier.plugins.registry import default_registry
from kvtier.spec import hookspecs

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("index", range(len(code_blocks(README, "python"))))
def test_readme_python_examples_run(index: int) -> None:
    source = code_blocks(README, "python")[index]
    exec(compile(source, f"README.md[python {index}]", "exec"), {"__name__": "readme"})


def test_readme_plugin_example_is_under_60_lines() -> None:
    plugin = next(b for b in code_blocks(README, "python") if "class DictBackend" in b)
    assert len(plugin.strip().splitlines()) <= 60


def test_readme_yaml_example_validates(tmp_path: Path) -> None:
    (example,) = code_blocks(README, "yaml")
    path = tmp_path / "tiers.yaml"
    path.write_text(example)
    config = load_config(path)
    assert [t.name for t in config.tiers] == ["ram", "nvme"]
    assert config.tiers[1].codec == "zstd" and config.tiers[1].write == "back"


def test_readme_tier_key_table_lists_every_tier_key() -> None:
    documented = set(re.findall(r"^\| `(\w+)` \| [^|]+ \| [^|]+ \|$", README, flags=re.M))
    assert documented == set(file_keys(TIER_OPTIONS))


def test_readme_tier_key_table_gives_the_defaults_of_tier_config() -> None:
    documented = dict(re.findall(r"^\| `(\w+)` \| `?([^|`]+)`? \| [^|]+ \|$", README, flags=re.M))
    for key, opt in TIER_OPTIONS.items():
        want = "required" if opt.required else str(opt.default).lower()
        assert documented[key] == want, key


@pytest.mark.parametrize("backend", ["host", "fs", "object", "peer"])
def test_readme_backend_table_lists_every_option(backend: str) -> None:
    rows = re.findall(r"^\| ?(`\w+`)? ?\| `(\w+)` \| [^|]+ \| [^|]+ \|$", README, flags=re.M)
    documented: dict[str, set[str]] = {}
    current = ""
    for name, option in rows:
        current = name.strip("`") or current
        documented.setdefault(current, set()).add(option)
    assert documented[backend] == set(file_keys(default_registry().options(backend)))


def test_every_hook_has_a_full_docstring() -> None:
    hooks = [getattr(hookspecs, n) for n in dir(hookspecs) if n.startswith("kvtier_")]
    # 1.1 kvtier_scan, 1.2 kvtier_keep, 1.3 kvtier_expire, 1.4 kvtier_deadlines; kvtier_tamper
    assert len(hooks) == 15
    for hook in hooks:
        doc = inspect.getdoc(hook) or ""
        assert doc, hook.__name__
        for param in inspect.signature(hook).parameters:
            assert f":param {param}:" in doc or f"``{param}``" in doc, (hook.__name__, param)
        # first-result hooks are named once, in the module docstring
        answers = hook.__name__ not in ("kvtier_open", "kvtier_close")
        assert hook.kvtier_spec["firstresult"] == answers, hook.__name__
    assert "*first-result* hook" in (hookspecs.__doc__ or "")


def test_required_hooks_come_first_and_the_registry_enforces_them() -> None:
    source = (ROOT / "spec" / "hookspecs.py").read_text()
    required = source.index("# required: the data path")
    optional = source.index("# optional:")
    for name in hookspecs.REQUIRED_HOOKS:
        assert required < source.index(f"def {name}(") < optional, name


def test_contract_version_is_documented_in_the_spec() -> None:
    assert re.fullmatch(r"\d+\.\d+", kvtier.CONTRACT_VERSION)
    assert "CONTRACT_VERSION" in (ROOT / "spec" / "hookspecs.py").read_text()


def test_readme_yaml_is_plain_yaml() -> None:
    for block in code_blocks(README, "yaml"):
        assert isinstance(yaml.safe_load(block), dict)
