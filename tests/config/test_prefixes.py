"""The ``keep_prefixes`` entries every integration takes (``kvtier.config.prefixes``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.config.prefixes import PrefixEntry, parse_prefixes


def test_entries_with_ids_inline_or_in_a_file_and_the_engines_own_fields(
        tmp_path: Path) -> None:
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps([5, 6, 7]))
    got = parse_prefixes([{"token_ids": [1, 2], "tenant": "acme", "cache_salt": "s"},
                          {"name": "bot", "token_ids_file": str(ids)}],
                         ("cache_salt", "extra_key"))
    assert got == (
        PrefixEntry("prefix-0", "acme", (1, 2), {"cache_salt": "s", "extra_key": None}),
        PrefixEntry("bot", None, (5, 6, 7), {"cache_salt": None, "extra_key": None}),
    )


@pytest.mark.parametrize(("value", "message"), [
    ({"token_ids": [1]}, "expected a list of prefixes"),
    (["x"], "prefix 0: expected a mapping"),
    ([{"token_ids": [1], "model_name": "m"}], "unknown key(s) ['model_name']"),
    ([{"token_ids": [1], "cache_salt": 3}], "'cache_salt': expected a string"),
    ([{"token_ids": [1], "tenant": "no spaces"}], "tenant"),
    ([{"token_ids": [1], "token_ids_file": "f"}], "give one of"),
    ([{}], "give one of"),
    ([{"token_ids": []}], "non-empty list of token ids"),
    ([{"token_ids": [1, True]}], "non-empty list of token ids"),
    ([{"token_ids": [-1]}], "non-empty list of token ids"),
    ([{"token_ids_file": "/nonexistent/ids.json"}], "'token_ids_file'"),
])
def test_a_bad_entry_is_a_value_error_that_names_it(value: object, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_prefixes(value, ("cache_salt",))
    assert message in str(err.value)
