"""NaN and infinity are refused wherever the configuration reads a number.

NaN compares false with everything, so it slipped past every range check
(``load_margin: .nan`` declined every load); infinity, or a number too large
for a float, overflowed what it sized (a traceback).  Each is one problem
naming its key, from YAML (``.nan``, ``.inf``), from ``${VAR}``, and from a dict.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtier.cli import cli
from kvtier.config.chain_config import load_config, validate_config
from kvtier.config.units import parse_duration, parse_size
from kvtier.spec import ConfigError

HOST = "  - {name: ram, backend: host, capacity: 1MiB}\n"
FS = "  - {name: disk, backend: fs, url: /tmp/kv-finite}\n"
HUGE = "1" + "0" * 400  # an int no float holds
# (YAML text after the chain, the key reported)
CASES = [
    ("load_margin: .nan\n", "load_margin"),
    ("load_margin: .inf\n", "load_margin"),
    ("load_margin: -.inf\n", "load_margin"),
    ("load_margin: 1.0e+999\n", "load_margin"),
    ("cost_half_life: .inf\n", "cost_half_life"),
    ("cost_half_life: .nan\n", "cost_half_life"),
    (f"cost_half_life: {HUGE}\n", "cost_half_life"),
    (f"cost_half_life: {HUGE}s\n", "cost_half_life"),
    ("recompute: {512 tokens: 40ms, 2048 tokens: .nan}\n", "recompute"),
    ("recompute: {512 tokens: .inf}\n", "recompute"),
    (f"recompute: {HUGE}ms/token\n", "recompute"),
    ("record: {path: /tmp/t.jsonl, sample: .nan}\n", "record.sample"),
    ("metrics: {log_interval: .inf}\n", "metrics.log_interval"),
]
# in a tier entry: (the entry's extra keys, the key reported)
TIER_CASES = [
    ("sizing_sample: .nan", "chain[0].sizing_sample"),
    ("admit_sample: .nan, admit: 2", "chain[1].admit_sample"),
    (f"capacity: {HUGE}GiB", "chain[1].capacity"),
    ("io_threads: 2, sizing_sample: .inf", "chain[1].sizing_sample"),
]


def one_problem(text: str, tmp_path: Path) -> ConfigError:
    path = tmp_path / "chain.yaml"
    path.write_text(text)
    config, problems = validate_config(path)
    assert config is None and len(problems) == 1, problems
    return problems[0]


@pytest.mark.parametrize(("extra", "key"), CASES)
def test_top_level_numbers(tmp_path: Path, extra: str, key: str) -> None:
    problem = one_problem("chain:\n" + HOST + extra, tmp_path)
    assert problem.key == key or problem.key.startswith(key)
    assert "finite" in problem.reason and "\n" not in str(problem)


@pytest.mark.parametrize(("entry", "key"), TIER_CASES)
def test_tier_numbers(tmp_path: Path, entry: str, key: str) -> None:
    host, disk = HOST, FS
    if key.startswith("chain[0]"):
        host = HOST.replace("}", f", {entry}}}")
    else:
        disk = FS.replace("}", f", {entry}}}")
    problem = one_problem("chain:\n" + host + disk, tmp_path)
    assert problem.key == key
    assert "finite" in problem.reason


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              value: str) -> None:
    monkeypatch.setenv("KV_MARGIN", value)
    problem = one_problem("chain:\n" + HOST + "load_margin: ${KV_MARGIN}\n", tmp_path)
    assert problem.key == "load_margin"
    assert problem.reason == f"expected a finite number, got {value!r}"


def test_from_a_dict() -> None:
    chain = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]}
    for key, value in (("load_margin", math.nan), ("load_margin", math.inf),
                       ("cost_half_life", math.nan), ("cost_half_life", -math.inf)):
        with pytest.raises(ConfigError) as info:
            load_config({**chain, key: value})
        assert info.value.key == key and "finite" in info.value.reason
    assert load_config({**chain, "load_margin": 0.5}).load.margin == 0.5  # finite still loads


def test_config_validate_says_it_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "chain.yaml"
    path.write_text("chain:\n" + HOST + "load_margin: .nan\n")
    result = CliRunner().invoke(cli, ["config", "validate", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: {path}:3: load_margin: expected a finite number, got nan",
        f"{path}: 1 problem(s)"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, int(HUGE), f"{HUGE}s",
                                 f"{HUGE}ms"])
def test_parse_duration_refuses(bad: object) -> None:
    with pytest.raises(ValueError, match="finite"):
        parse_duration(bad)


@pytest.mark.parametrize("bad", [f"{HUGE}", f"{HUGE}GiB", f"{HUGE}.5TB"])
def test_parse_size_refuses(bad: object) -> None:
    with pytest.raises(ValueError, match="finite"):
        parse_size(bad)
