"""A named prefix to keep, as the engines' integrations take it (``keep_prefixes``).

The vLLM tier, the SGLang storage backend and the LMCache adapter each keep
a named prefix (a system prompt) by its token ids, hashed with the engine's
own function (docs/tenants.md, "Keep").  What the operator writes is the
same for all three: a list of entries, each with ``token_ids`` (a list of
token ids) or ``token_ids_file`` (a JSON file holding one, read at once),
and optionally ``name`` and ``tenant``, plus the string fields each engine
hashes in besides the tokens (``cache_salt``; SGLang's ``extra_key``;
LMCache's ``model_name``).  JSON only: nothing read is executed.

The commands that print an engine's flag (``kvtier vllm-args``, ``kvtier
sglang-args``, ``kvtier lmcache-args``) take entries as ``--keep-prefix`` text
(:func:`prefixes_from_texts`) and write them checked, a file named by absolute
path (:func:`check_prefix`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kvtier.block.namespace import check_tenant

__all__ = ["PrefixEntry", "check_prefix", "parse_prefixes", "prefix_from_text",
           "prefixes_from_texts"]

T = TypeVar("T")

_COMMON = frozenset({"name", "tenant", "token_ids", "token_ids_file"})


@dataclass(frozen=True)
class PrefixEntry:
    """One entry: its name (``prefix-<n>`` if none), tenant (None: the integration's
    default), token ids, and the engine's own fields (None where not given)."""

    name: str
    tenant: str | None
    token_ids: tuple[int, ...]
    fields: Mapping[str, str | None]


def parse_prefixes(value: Any, fields: Sequence[str]) -> tuple[PrefixEntry, ...]:
    """The entries of a ``keep_prefixes`` list whose engine hashes in ``fields`` (strings)
    besides the tokens; a ValueError names the entry and what is wrong with it."""
    if not isinstance(value, list):
        raise ValueError(f"expected a list of prefixes, got {type(value).__name__}")
    out = []
    for index, entry in enumerate(value):
        try:
            out.append(_entry(index, entry, fields))
        except ValueError as exc:
            raise ValueError(f"prefix {index}: {exc}") from None
    return tuple(out)


def check_prefix(entry: Any, fields: Sequence[str]) -> tuple[PrefixEntry, dict[str, Any]]:
    """One entry checked as :func:`parse_prefixes` checks it (named ``prefix-0`` if
    unnamed), and a copy of it for an engine's flag: its ``token_ids_file`` absolute,
    since the engine may start in another directory.  A ValueError says what is wrong."""
    prefix = _entry(0, entry, fields)
    portable = dict(entry)
    if "token_ids_file" in portable:
        portable["token_ids_file"] = os.path.abspath(str(portable["token_ids_file"]))
    return prefix, portable


def prefix_from_text(text: str) -> dict[str, Any]:
    """An entry as a command line gives it (``--keep-prefix``), not yet checked
    (:func:`check_prefix` checks it): a JSON object, the entry as a config writes
    it, or ``KEY=VALUE`` pairs split by commas, each value a string but that of
    ``token_ids``, a JSON list whose commas split nothing::

        name=support-bot,tenant=acme,token_ids_file=support-bot.json,cache_salt=s-acme
        token_ids=[1,2,3],cache_salt=s-acme

    A ValueError says what is malformed."""
    text = text.strip()
    if text.startswith("{"):
        try:
            entry: dict[str, Any] = json.loads(text)  # a text opening with { is an object
        except ValueError as exc:
            raise ValueError(f"not a JSON object: {exc}") from None
        return entry
    out: dict[str, Any] = {}
    for pair in _split_pairs(text):
        key, eq, value = pair.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"expected KEY=VALUE pairs split by commas (or a JSON object), "
                             f"got {pair!r}")
        if key in out:
            raise ValueError(f"{key!r} given twice")
        if key == "token_ids":
            try:
                out[key] = json.loads(value)
            except ValueError:
                out[key] = None
            if not isinstance(out[key], list):
                raise ValueError(f"'token_ids': expected a JSON list such as [1,2,3], "
                                 f"got {value!r}")
        else:
            out[key] = value
    return out


def prefixes_from_texts(texts: Iterable[str], check: Callable[[dict[str, Any]], T]) -> list[T]:
    """Each ``--keep-prefix`` text read (:func:`prefix_from_text`) and checked by ``check``
    (the command's own check of an entry); a ValueError names the text it is about."""
    out = []
    for text in texts:
        try:
            out.append(check(prefix_from_text(text)))
        except ValueError as exc:
            raise ValueError(f"--keep-prefix {text!r}: {exc}") from None
    return out


def _split_pairs(text: str) -> list[str]:
    """``text`` split at the commas outside brackets (a ``token_ids`` list keeps its own)."""
    pairs, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth <= 0:
            pairs.append(text[start:i])
            start = i + 1
    pairs.append(text[start:])
    return pairs


def _entry(index: int, entry: Any, fields: Sequence[str]) -> PrefixEntry:
    """The entry checked; a ValueError says what is wrong (its caller names the entry)."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"expected a mapping, got {type(entry).__name__}")
    known = _COMMON | set(fields)
    unknown = sorted(set(map(str, entry)) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; known: {sorted(known)}")
    name, tenant = entry.get("name", f"prefix-{index}"), entry.get("tenant")
    own = {field: entry.get(field) for field in fields}
    for key, given in (("name", name), ("tenant", tenant), *own.items()):
        if given is not None and not isinstance(given, str):
            raise ValueError(f"{key!r}: expected a string, got {given!r}")
    if tenant is not None:
        check_tenant(tenant)
    if ("token_ids" in entry) == ("token_ids_file" in entry):
        raise ValueError("give one of 'token_ids' and 'token_ids_file'")
    ids = entry.get("token_ids")
    if ids is None:
        path = Path(str(entry["token_ids_file"]))
        try:
            ids = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"'token_ids_file' {str(path)!r}: {exc}") from None
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
        raise ValueError("expected a non-empty list of token ids (integers, 0 or more)")
    return PrefixEntry(str(name), tenant, tuple(ids), own)
