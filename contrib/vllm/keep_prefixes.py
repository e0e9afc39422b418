"""Named prefixes kept: the ``keep_prefixes`` option of kvtier's vLLM tier.

An operator names a prefix to keep, a system prompt, by its token ids, for one
tenant, in the ``secondary_tiers`` entry (in ``--kv-transfer-config``, or the
YAML file ``vllm serve --config`` reads)::

    keep_prefixes:
      - name: support-bot                  # for the log (default: prefix-<n>)
        tenant: acme                       # default: the tier's tenant
        token_ids_file: /etc/kvtier/support-bot.json   # or token_ids: [...]
        cache_salt: salt-acme              # the salt its requests send, if any

Every block of a request of that tenant whose key is one of the prefix's full
blocks is marked kept in the tenant's chain (:meth:`Chain.keep
<kvtier.chain.Chain.keep>`), within the tenant's ``keep`` budget, as
:mod:`.hints` marks a request's: when the tier has stored it, and when a
request has loaded it (once per process), so a prefix stored before is kept
too.  A trailing part block of the prefix is not kept:
its block holds what follows the prefix too.

**Matched by hash.**  vLLM hands a tier no tokens: a ``ReqContext`` holds a
request's ``kv_transfer_params``, ``kv_hints`` and its keys' token positions,
and a key is a block hash, each full block's hash chained over its parent's,
the first over the engine's seed and the request's ``cache_salt``.  So the
tier hashes the prefix itself with vLLM's own function, in the engine's
process once vLLM has seeded it
(:func:`~kvtier.contrib.vllm._compat.prefix_block_hashes`), and a key is the
prefix's when its block hash is one of those.  Chaining makes that exact: a
block hashes alike only where every token before it is the prefix's.
Requests with a LoRA adapter, multimodal input or prompt embeddings hash
those in too, and match no prefix.

**Token ids, not text.**  The tier is given no tokenizer and no vLLM config
(none is current when vLLM builds it), and a text's tokens depend on the chat
template and special tokens; the engine's own tokenizer, or ``vllm serve``'s
``/tokenize`` endpoint, gives the ids its requests will have.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from kvtier.block.namespace import DEFAULT_TENANT
from kvtier.config.prefixes import parse_prefixes

from ._compat import offload_block_hash, offloading_fields, prefix_block_hashes
from .args import PREFIX_FIELDS
from .hints import _WAIT_S, Keeper, RequestHints
from .keys import chain_key

__all__ = ["KeepPrefix", "PrefixKeeper", "parse_keep_prefixes", "prefix_keeper"]

log = logging.getLogger("kvtier.vllm")


@dataclass(frozen=True)
class KeepPrefix:
    """A prefix to keep: its tenant's (None: the tier's tenant) token ids."""

    name: str
    tenant: str | None
    token_ids: tuple[int, ...]
    cache_salt: str | None = None


def parse_keep_prefixes(value: Any) -> tuple[KeepPrefix, ...]:
    """The ``keep_prefixes`` option: a list of mappings, each with ``token_ids`` (a list
    of token ids) or ``token_ids_file`` (a JSON file holding one, read now), and
    optionally ``name``, ``tenant`` and ``cache_salt`` (:mod:`kvtier.config.prefixes`).
    ValueError names what is wrong."""
    return tuple(KeepPrefix(e.name, e.tenant, e.token_ids, e.fields["cache_salt"] or None)
                 for e in parse_prefixes(value, PREFIX_FIELDS))


class PrefixKeeper(Keeper):
    """A vLLM tier's :class:`~.hints.Keeper`, which also marks the blocks of its
    tenants' named prefixes as its jobs store or load them (:meth:`done`).

    A mark waits for the tier's ``pending`` work too: a store that replaces a
    block that failed to load runs on the tier's repair thread, not as a chain
    job, and a mark made before it lands finds no block to keep.
    """

    def __init__(
        self,
        chain_of: Callable[[str], Any],
        gate: AbstractContextManager[Any],
        prefixes: Sequence[KeepPrefix],
        *,
        tenant: str,
        shared: frozenset[str],
        tokens_per_hash: int,
        block_hashes: Callable[[Sequence[int], int, str | None], list[bytes] | None],
        block_hash_of: Callable[[bytes], bytes],
        pending: Callable[[], Iterable[Future[Any]]] = tuple,
    ) -> None:
        super().__init__(chain_of, gate)
        self._pending = pending
        self._prefixes: dict[str, list[KeepPrefix]] = {}
        for prefix in prefixes:  # by the tenant its requests resolve to
            owner = prefix.tenant or tenant
            owners = {DEFAULT_TENANT if owner in shared else owner}
            if owner == tenant:  # the tier's own requests that name none come as its own
                owners.add(tenant)
            for name in owners:
                self._prefixes.setdefault(name, []).append(prefix)
        self._tokens_per_hash = tokens_per_hash
        self._block_hashes = block_hashes
        self._block_hash_of = block_hash_of
        self._hashes: dict[str, frozenset[bytes]] | None = None  # per tenant, once seeded
        self._found: set[tuple[str, bytes]] = set()  # prefix blocks loaded and marked

    def done(self, tenant: str, keys: Sequence[bytes], load: bool) -> None:
        """A job of ``tenant`` stored, or loaded, ``keys`` (vLLM keys): those of its
        prefixes are marked (loaded ones once per process)."""
        ours = self._matching(tenant, keys)
        if load:
            ours = [k for k in ours if (tenant, k) not in self._found]
            self._found.update((tenant, k) for k in ours)
        if ours:
            self.submit(tenant, [chain_key(k) for k in ours])

    def _apply(self, tenant: str, keys: list[bytes], hints: RequestHints) -> None:
        with self._gate:  # the store that asked is submitted: its repair, if any, listed
            pending = list(self._pending())
        wait_futures(pending, timeout=_WAIT_S)
        super()._apply(tenant, keys, hints)

    def _matching(self, tenant: str, keys: Sequence[bytes]) -> list[bytes]:
        if tenant not in self._prefixes:
            return []
        hashes = self._tenant_hashes()
        if hashes is None:
            return []
        ours = hashes.get(tenant, frozenset())
        return [k for k in keys if self._block_hash_of(k) in ours]

    def _tenant_hashes(self) -> dict[str, frozenset[bytes]] | None:
        """Each tenant's prefix block hashes, once vLLM has seeded its hashes."""
        if self._hashes is None:
            blocks = [(tenant, prefix, self._block_hashes(
                prefix.token_ids, self._tokens_per_hash, prefix.cache_salt))
                for tenant, prefixes in self._prefixes.items() for prefix in prefixes]
            if any(hashes is None for _, _, hashes in blocks):
                return None  # not seeded yet: asked again on the next request
            tenants: dict[str, set[bytes]] = {}
            for tenant, prefix, hashes in blocks:
                tenants.setdefault(tenant, set()).update(hashes or ())
                log.info("kvtier: keeping prefix %r of tenant %r: %d block(s) of %d tokens",
                         prefix.name, tenant, len(hashes or ()), self._tokens_per_hash)
            self._hashes = {t: frozenset(h) for t, h in tenants.items()}
        return self._hashes



def prefix_keeper(chain_of: Callable[[str], Any], gate: AbstractContextManager[Any],
                  options: Any, spec: Any,
                  pending: Callable[[], Iterable[Future[Any]]] = tuple) -> PrefixKeeper:
    """The keeper of a tier with ``options`` (its ``TierOptions``) on vLLM's ``spec``,
    whose ``pending`` work (its repairs) a mark waits for."""
    return PrefixKeeper(
        chain_of, gate, options.keep_prefixes, tenant=options.tenant,
        shared=options.shared_tenants,
        tokens_per_hash=offloading_fields(spec.config)["tokens_per_hash"],
        block_hashes=prefix_block_hashes, block_hash_of=offload_block_hash, pending=pending)
