"""The ``keep_prefixes`` adapter param, checked: named prefixes (token ids) to keep.

Free of LMCache imports, as :mod:`.settings` is; :mod:`.keep` hashes the
prefixes with LMCache's own hasher and marks their chunks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.block.namespace import check_tenant

__all__ = ["KeepPrefix", "parse_keep_prefixes"]

_FIELDS = frozenset({"name", "tenant", "token_ids", "token_ids_file", "cache_salt",
                     "model_name"})


@dataclass(frozen=True)
class KeepPrefix:
    """A prefix to keep: its token ids, the ``cache_salt`` its requests send (``""``:
    none), its tenant (None: its salt's, as the adapter maps salts) and, if named, the
    one model whose chunks it keeps (None: every model's)."""

    name: str
    tenant: str | None
    token_ids: tuple[int, ...]
    cache_salt: str = ""
    model_name: str | None = None


def parse_keep_prefixes(value: Any) -> tuple[KeepPrefix, ...]:
    """A list of mappings, each with ``token_ids`` (a list of token ids) or
    ``token_ids_file`` (a JSON file holding one, read now), and optionally ``name``,
    ``tenant``, ``cache_salt`` and ``model_name``.  ValueError names what is wrong."""
    if not isinstance(value, list):
        raise ValueError(f"expected a list of prefixes, got {type(value).__name__}")
    return tuple(_prefix(i, entry) for i, entry in enumerate(value))


def _prefix(index: int, entry: Any) -> KeepPrefix:
    where = f"prefix {index}"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(entry).__name__}")
    unknown = sorted(set(map(str, entry)) - _FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(_FIELDS)}")
    name = entry.get("name", f"prefix-{index}")
    tenant, salt, model = entry.get("tenant"), entry.get("cache_salt"), entry.get("model_name")
    for key, given in (("name", name), ("tenant", tenant), ("cache_salt", salt),
                       ("model_name", model)):
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
    return KeepPrefix(str(name), tenant, tuple(ids), salt or "", model or None)
