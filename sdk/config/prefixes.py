"""A named prefix to keep, as the engines' integrations take it (``keep_prefixes``).

The vLLM tier, the SGLang storage backend and the LMCache adapter each keep
a named prefix (a system prompt) by its token ids, hashed with the engine's
own function (docs/tenants.md, "Keep").  What the operator writes is the
same for all three: a list of entries, each with ``token_ids`` (a list of
token ids) or ``token_ids_file`` (a JSON file holding one, read at once),
and optionally ``name`` and ``tenant``, plus the string fields each engine
hashes in besides the tokens (``cache_salt``; SGLang's ``extra_key``;
LMCache's ``model_name``).  JSON only: nothing read is executed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.block.namespace import check_tenant

__all__ = ["PrefixEntry", "parse_prefixes"]

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
    return tuple(_entry(i, entry, fields) for i, entry in enumerate(value))


def _entry(index: int, entry: Any, fields: Sequence[str]) -> PrefixEntry:
    where = f"prefix {index}"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(entry).__name__}")
    known = _COMMON | set(fields)
    unknown = sorted(set(map(str, entry)) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    name, tenant = entry.get("name", f"prefix-{index}"), entry.get("tenant")
    own = {field: entry.get(field) for field in fields}
    for key, given in (("name", name), ("tenant", tenant), *own.items()):
        if given is not None and not isinstance(given, str):
            raise ValueError(f"{where}: {key!r}: expected a string, got {given!r}")
    if tenant is not None:
        check_tenant(tenant)
    if ("token_ids" in entry) == ("token_ids_file" in entry):
        raise ValueError(f"{where}: give one of 'token_ids' and 'token_ids_file'")
    ids = entry.get("token_ids")
    if ids is None:
        path = Path(str(entry["token_ids_file"]))
        try:
            ids = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{where}: 'token_ids_file' {str(path)!r}: {exc}") from None
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
        raise ValueError(f"{where}: expected a non-empty list of token ids (integers, 0 or "
                         "more)")
    return PrefixEntry(str(name), tenant, tuple(ids), own)
