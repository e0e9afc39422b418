"""docs/sizing.md matches the code: its YAML validates and every option it names exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from kvtier.config.chain_config import validate_config
from kvtier.plan.cli import plan_command

TEXT = (Path(__file__).resolve().parents[2] / "docs" / "sizing.md").read_text()


def test_the_guides_chains_validate() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", TEXT, flags=re.S)
    assert blocks
    loaded_all = []
    for block in blocks:
        loaded, problems = validate_config(yaml.safe_load(block))
        assert not problems and loaded is not None
        loaded_all.append(loaded)
    assert any(c.record is not None for c in loaded_all)
    assert any(t.admit > 1 for c in loaded_all for t in c.tiers)
    assert any(t.admit_sample > 0 for c in loaded_all for t in c.tiers)


def test_every_option_the_guide_names_is_one_of_plan() -> None:
    flags = {opt for param in plan_command.params for opt in param.opts + param.secondary_opts}
    table = set(re.findall(r"^\| `(--[\w-]+)(?:/(--[\w-]+))?`", TEXT, flags=re.M))
    named = {flag for pair in table for flag in pair if flag}
    commands = [line.split("#")[0] for line in re.findall(r"^\$ (kvtier plan .*)$", TEXT, re.M)]
    named |= {word for command in commands for word in shlex.split(command) if
              word.startswith("--")}
    assert len(named) >= 8 and named <= flags, named - flags
    documented = {flag for flag in flags if flag.startswith("--") and flag != "--help"}
    assert documented - named <= {"--generate", "--save-trace"}  # in the guide's prose
    assert "--generate KIND:REQUESTS[:SEED]" in TEXT and "--save-trace FILE" in TEXT
