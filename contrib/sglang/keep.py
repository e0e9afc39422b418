"""Named prefixes kept: the ``keep_prefixes`` key of the HiCache extra config.

An operator names a prefix to keep, a system prompt, by its token ids, in
``--hicache-storage-backend-extra-config``::

    "keep_prefixes": [{"name": "support-bot",           # for the log (default: prefix-<n>)
                       "tenant": "acme",                # default: the engine's tenant
                       "token_ids_file": "/etc/kvtier/support-bot.json",  # or "token_ids"
                       "extra_key": null,               # what the requests hash in besides
                       "cache_salt": "salt-acme"}]      # tokens, if anything

Every page of the prefix that SGLang stores (``batch_set``, ``batch_set_v1``)
is marked kept in the engine's chain (:meth:`Chain.keep
<kvtier.chain.Chain.keep>`), within the tenant's ``keep`` budget, and every
page of it that SGLang loads (``batch_get``, ``batch_get_v1``) once per
process, so a prefix stored before is kept too.  A trailing part page is not
kept: it holds what follows the prefix too.

**Matched by hash.**  SGLang hands its storage no tokens, only page keys:
SHA-256 hashes, each page's chained over the one before, the first over a
seed made of the request's ``extra_key`` (its LoRA adapter's id, or what its
caller set) and ``cache_salt``.  So the prefix is hashed with SGLang's own
functions (:func:`prefix_page_hashes`), once the host pool names the page
size, and a page key is the prefix's when it is one of those.  Chaining makes
that exact: a page hashes alike only where every token before it is the
prefix's.

**Per tenant.**  SGLang's calls carry no request: every page is the engine's
tenant's (the extra config's ``tenant``).  A prefix named for another tenant
keeps nothing here, and says so in the log.  A hybrid model's extra pools
(Mamba states: the v2 calls) keep no marks.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_storage_hash_str

from kvtier.config.prefixes import parse_prefixes

from .args import PREFIX_FIELDS

__all__ = ["KeepPrefix", "PageKeeper", "parse_keep_prefixes", "prefix_page_hashes"]

log = logging.getLogger("kvtier.sglang")


@dataclass(frozen=True)
class KeepPrefix:
    """A prefix to keep: its tenant's (None: the engine's) token ids, and what SGLang
    hashes in besides them."""

    name: str
    tenant: str | None
    token_ids: tuple[int, ...]
    extra_key: str | None = None
    cache_salt: str | None = None


def parse_keep_prefixes(value: Any) -> tuple[KeepPrefix, ...]:
    """The ``keep_prefixes`` key: a list of mappings, each with ``token_ids`` (a list of
    token ids) or ``token_ids_file`` (a JSON file holding one, read now), and optionally
    ``name``, ``tenant``, ``extra_key`` and ``cache_salt`` (:mod:`kvtier.config.prefixes`).
    ValueError names what is wrong."""
    # SGLang reads an empty salt as none (RadixKey), so the prefix does too
    return tuple(KeepPrefix(e.name, e.tenant, e.token_ids, e.fields["extra_key"],
                            e.fields["cache_salt"] or None)
                 for e in parse_prefixes(value, PREFIX_FIELDS))


def prefix_page_hashes(prefix: KeepPrefix, page_size: int) -> list[str]:
    """The page keys SGLang gives the prefix's full pages: its own storage hash
    (``get_storage_hash_str``) of a ``RadixKey`` with the prefix's extra key and salt."""
    full = len(prefix.token_ids) - len(prefix.token_ids) % page_size
    if not full:
        return []
    key = RadixKey(array("q", prefix.token_ids[:full]), extra_key=prefix.extra_key,
                   cache_salt=prefix.cache_salt)
    hashes = get_storage_hash_str(key, None, page_size=page_size)
    return [hashes] if isinstance(hashes, str) else list(hashes)


class PageKeeper:
    """Which of SGLang's page keys are the engine tenant's prefixes', stored or loaded.

    Built when the host pool is registered: the prefixes of the engine's
    tenant are hashed then; those of other tenants are logged and dropped.
    """

    def __init__(self, prefixes: Sequence[KeepPrefix], tenant: str, page_size: int) -> None:
        hashes: set[str] = set()
        for prefix in prefixes:
            owner = prefix.tenant or tenant
            if owner != tenant:
                log.warning("kvtier: prefix %r is tenant %r's, and this engine's tenant is %r: "
                            "it keeps nothing here", prefix.name, owner, tenant)
                continue
            pages = prefix_page_hashes(prefix, page_size)
            hashes.update(pages)
            log.info("kvtier: keeping prefix %r of tenant %r: %d page(s) of %d tokens",
                     prefix.name, tenant, len(pages), page_size)
        self.hashes = frozenset(hashes)
        self._found: set[str] = set()  # pages loaded and marked: once per process
        self._lock = threading.Lock()  # SGLang's prefetch and backup threads both call

    def __bool__(self) -> bool:
        return bool(self.hashes)

    def matching(self, keys: Sequence[str], load: bool) -> list[str]:
        """The page keys among ``keys`` that are a prefix's (loaded ones once each)."""
        ours = [k for k in keys if k in self.hashes]
        if load and ours:
            with self._lock:
                ours = [k for k in dict.fromkeys(ours) if k not in self._found]
                self._found.update(ours)
        return ours
