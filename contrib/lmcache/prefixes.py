"""The ``keep_prefixes`` adapter param, checked: named prefixes (token ids) to keep.

Free of LMCache imports, as :mod:`.settings` is; :mod:`.keep` hashes the
prefixes with LMCache's own hasher and marks their chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtier.config.prefixes import parse_prefixes

__all__ = ["PREFIX_FIELDS", "KeepPrefix", "parse_keep_prefixes"]

#: What an entry names besides its tokens: the salt LMCache keys its chunks
#: with, and the one model whose chunks it keeps.
PREFIX_FIELDS = ("cache_salt", "model_name")


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
    ``tenant``, ``cache_salt`` and ``model_name`` (:mod:`kvtier.config.prefixes`).
    ValueError names what is wrong."""
    return tuple(KeepPrefix(e.name, e.tenant, e.token_ids, e.fields["cache_salt"] or "",
                            e.fields["model_name"] or None)
                 for e in parse_prefixes(value, PREFIX_FIELDS))
