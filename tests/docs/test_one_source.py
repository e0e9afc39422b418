"""Each fact of the block format has one home; the config and the README follow it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvtier.block import framing

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SOURCES = [p for folder in ("sdk", "spec", "backends") for p in (ROOT / folder).rglob("*.py")]

#: name -> the module that defines it; every other module imports it
HOMES = {
    "FORMAT_VERSION": "sdk/block/namespace.py",
    "ALIGN": "sdk/block/header.py",
    "ALIGN_MIN": "sdk/block/header.py",
    "CODECS": "sdk/block/header.py",
    "SHUFFLE_WIDTHS": "sdk/block/header.py",
    "ZSTD_LEVELS": "sdk/block/header.py",
}


@pytest.mark.parametrize("name", sorted(HOMES))
def test_a_format_fact_is_defined_once(name: str) -> None:
    assignment = re.compile(rf"^{name}\s*(:[^=]*)?=", re.M)
    homes = [str(p.relative_to(ROOT)) for p in SOURCES if assignment.search(p.read_text())]
    assert homes == [HOMES[name]]


def _tier_key_row(key: str) -> str:
    (row,) = re.findall(rf"^\| `{key}` \| [^|]+ \| ([^|]+) \|$", README, flags=re.M)
    return row


def test_readme_names_the_codecs_levels_and_shuffle_widths_of_the_format() -> None:
    # one key, codec: its level and shuffle are parts of it (zstd:3:shuffle=2)
    row = _tier_key_row("codec")
    assert set(framing.CODECS) <= set(re.findall(r"`(\w+)`", row))
    levels = framing.ZSTD_LEVELS
    assert f"{levels[0]} to {levels[-1]}" in row
    (widths,) = re.findall(r"or ([\d, ]+)\)", row)
    assert [int(w) for w in widths.split(",")] == [0, 1, *framing.SHUFFLE_WIDTHS]
