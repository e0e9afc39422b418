"""docs/settings.md matches the declarations: every setting now, and each old one's replacement."""

from __future__ import annotations

import re
from pathlib import Path

from settings_inventory import internal, old_keys, pairs, settings

DOC = (Path(__file__).parents[2] / "docs" / "settings.md").read_text()
NOW_RE = re.compile(r"^\| (\w+) \| `([\w.]+)` \| (\w+) \| [^|]+ \| (.+) \|$", re.M)
BEFORE_RE = re.compile(r"^\| (\w+) `([\w.]+)` \| (.+) \|$", re.M)
NAMED_RE = re.compile(r"^(\w+) `([\w.]+)`")
NEW_INTERNAL_RE = re.compile(r"^\| (\w+) `([\w.]+)` \| [^|]+ \|$", re.M)


def _section(title: str) -> str:
    return DOC.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_table_lists_every_setting_in_the_inventory_s_order() -> None:
    rows = [(scope, key) for scope, key, _, _ in NOW_RE.findall(_section("Every setting now"))]
    assert rows == [(r.scope, r.key) for r in settings()]


def test_the_counts_are_the_inventory_s() -> None:
    rows = NOW_RE.findall(_section("Every setting now"))
    fresh = {key for _, key, _, meaning in rows if "(new this round" in meaning}
    words = " ".join(DOC.split())
    assert "87 settings before" in words and "66 now counting each shared key once" in words
    assert len([r for r in settings() if r.key not in fresh]) == 66
    # a new shared key (tenants) is new in every backend that takes it
    assert len([r for r in pairs() if r.key not in fresh]) == 84
    assert "84 counting a shared key" in words
    assert len(BEFORE_RE.findall(_section("Before and after"))) == 87


def test_every_old_setting_names_its_replacement() -> None:
    now = {(r.scope, r.key) for r in settings()}
    renamed, only_commands = old_keys(), {(r.scope, r.key) for r in internal()}
    before = BEFORE_RE.findall(_section("Before and after"))
    seen = {(scope, key) for scope, key, _ in before}
    new_internal = set(NEW_INTERNAL_RE.findall(_section("Set by kvtier, new this round")))
    assert set(renamed) <= seen and only_commands <= seen | new_internal
    for scope, key, after in before:
        if (scope, key) in only_commands:
            assert after.startswith("none: set by kvtier's commands"), (scope, key)
            continue
        named = NAMED_RE.match(after)
        assert named is not None, (scope, key, after)
        assert (named[1], named[2]) in now, (scope, key, after)
        if (scope, key) in renamed:
            assert named[2] == renamed[(scope, key)] and "old key" in after, (scope, key)
        else:
            assert named[2] == key, (scope, key, after)
