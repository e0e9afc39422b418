"""A ``keep_prefixes`` entry as a command line gives it (``--keep-prefix``), and its copy
for an engine's flag (``kvtier.config.prefixes``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvtier.config.prefixes import PrefixEntry, check_prefix, prefix_from_text


def test_pairs_split_by_commas_but_those_of_a_token_list() -> None:
    assert prefix_from_text("name=bot, tenant=acme,token_ids=[1, 2,3],cache_salt=a=b") == {
        "name": "bot", "tenant": "acme", "token_ids": [1, 2, 3], "cache_salt": "a=b"}
    assert prefix_from_text("token_ids=[7],cache_salt=") == {"token_ids": [7], "cache_salt": ""}


def test_a_json_object_is_the_entry_as_written() -> None:
    entry = {"name": "bot", "token_ids": [1, 2], "extra_key": None, "cache_salt": "x,y"}
    assert prefix_from_text(" " + json.dumps(entry)) == entry


@pytest.mark.parametrize(("text", "message"), [
    ("", "expected KEY=VALUE pairs"),
    ("bot", "expected KEY=VALUE pairs"),
    ("=bot", "expected KEY=VALUE pairs"),
    ("token_ids=[1],", "expected KEY=VALUE pairs"),
    ("name=a,name=b", "'name' given twice"),
    ("token_ids=1,2", "'token_ids': expected a JSON list"),
    ("token_ids=[1,2", "'token_ids': expected a JSON list"),
    ('{"token_ids": [1]', "not a JSON object"),
])
def test_malformed_text_is_a_value_error_saying_what(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        prefix_from_text(text)
    assert message in str(err.value)


def test_the_copy_for_a_flag_names_its_file_by_absolute_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ids.json").write_text(json.dumps([4, 5]))
    monkeypatch.chdir(tmp_path)
    prefix, portable = check_prefix({"token_ids_file": "ids.json", "cache_salt": "s"},
                                    ("cache_salt",))
    assert prefix == PrefixEntry("prefix-0", None, (4, 5), {"cache_salt": "s"})
    assert portable == {"token_ids_file": os.path.join(str(tmp_path), "ids.json"),
                        "cache_salt": "s"}
    inline = {"token_ids": [1], "tenant": "acme"}
    assert check_prefix(inline, ())[1] == inline


def test_a_bad_entry_is_refused_without_naming_an_index() -> None:
    with pytest.raises(ValueError) as err:
        check_prefix({"token_ids": [1], "model_name": "m"}, ("cache_salt",))
    assert str(err.value).startswith("unknown key(s) ['model_name']")
