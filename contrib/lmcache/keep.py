"""Named prefixes kept: the ``keep_prefixes`` adapter param of the LMCache adapter.

An operator names a prefix to keep, a system prompt, by its token ids, in
``adapter_params`` (checked by :mod:`.prefixes`)::

    "keep_prefixes": [{"name": "support-bot",        # for the log (default: prefix-<n>)
                       "token_ids_file": "/etc/kvtier/support-bot.json",  # or "token_ids"
                       "cache_salt": "salt-acme",    # the salt its requests send, if any
                       "tenant": "acme",             # default: its salt's tenant
                       "model_name": "org/model"}],  # default: every model's chunks
    "chunk_size": 256, "hash_algorithm": "blake3"    # the server's --chunk-size and
                                                     # --hash-algorithm (these defaults)

Every chunk of the prefix that the adapter stores is marked kept in its
tenant's chain (:meth:`Chain.keep <kvtier.chain.Chain.keep>`), within the
tenant's ``keep`` budget, and every chunk of it that the adapter loads once
per process, so a prefix stored before is kept too.  A trailing part chunk
is not kept: LMCache stores no part chunk.

**Matched by hash.**  LMCache hands its L2 adapters no tokens, only
``ObjectKey``s: a chunk hash, chained over the chunk before, the model, the
rank, the object group and the request's ``cache_salt``.  So the prefix is
hashed with LMCache's own :class:`TokenHasher`, as its server hashes a
request's tokens (with its ``--chunk-size`` and ``--hash-algorithm``; the
adapter runs in the server's process, so even the ``builtin`` hash agrees), and
a key is the prefix's when its chunk hash and salt are the prefix's (and its
model, when named), whatever its rank and object group.  Chaining makes that
exact: a chunk hashes alike only where every token before it is the prefix's.

**Per tenant.**  A key's tenant is its salt's, as the adapter maps salts
(:mod:`.tenancy`; without ``tenants``, the adapter's own).  A prefix whose
``tenant`` is not its salt's keeps nothing, and says so in the log.

Marks are asked for before a store's or load's result is signalled, and made
on a thread of their own: LMCache's controllers never wait for them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

from lmcache.v1.multiprocess.token_hasher import TokenHasher

from .keys import ObjectKeyLike
from .prefixes import KeepPrefix
from .settings import AdapterSettings

__all__ = ["PrefixKeeper", "prefix_chunk_hashes"]

log = logging.getLogger("kvtier.contrib.lmcache")


def prefix_chunk_hashes(hasher: TokenHasher, prefix: KeepPrefix) -> list[bytes]:
    """The chunk hashes LMCache's server gives the prefix's full chunks."""
    return [bytes(h) for h in hasher.compute_chunk_hashes(list(prefix.token_ids))]


class PrefixKeeper:
    """Which of the adapter's stored and loaded keys are its prefixes', marked kept.

    ``tenancy`` is the adapter's :class:`~.tenancy.LMCacheTenancy`: the tenant
    of a salt, and :meth:`~.tenancy.LMCacheTenancy.keep`.
    """

    def __init__(self, settings: AdapterSettings, tenancy: Any) -> None:
        self._tenancy = tenancy
        #: (salt, chunk hash) -> the models whose chunks are kept (None: every model's)
        self._chunks: dict[tuple[str, bytes], set[str | None]] = {}
        self._found: set[bytes] = set()  # keys (the tenancy's) loaded and marked
        self._lock = threading.Lock()
        self._pending: set[Future[None]] = set()
        self._pool: ThreadPoolExecutor | None = None
        self.kept = 0  # marks the chains granted
        if not settings.keep_prefixes:
            return
        hasher = TokenHasher(chunk_size=settings.chunk_size,
                             hash_algorithm=settings.hash_algorithm)
        for prefix in settings.keep_prefixes:
            owner = tenancy.tenant_of(prefix.cache_salt)
            if prefix.tenant is not None and tenancy.resolve(prefix.tenant) != owner:
                log.warning("kvtier: prefix %r is named for tenant %r, and its salt %r is "
                            "tenant %r's: it keeps nothing", prefix.name, prefix.tenant,
                            prefix.cache_salt, owner)
                continue
            hashes = prefix_chunk_hashes(hasher, prefix)
            for chunk in hashes:
                self._chunks.setdefault((prefix.cache_salt, chunk), set()).add(prefix.model_name)
            log.info("kvtier: keeping prefix %r of tenant %r: %d chunk(s) of %d tokens",
                     prefix.name, owner, len(hashes), settings.chunk_size)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvtier-keep")

    def __bool__(self) -> bool:
        return bool(self._chunks)

    def done(self, keys: Sequence[ObjectKeyLike], load: bool) -> None:
        """The adapter stored (or loaded: ``load``) ``keys``: mark its prefixes' chunks."""
        if not self._chunks or not keys:
            return
        ours = [k for k in keys if self._ours(k)]
        if load and ours:
            with self._lock:
                fresh = {self._tenancy.key(k): k for k in ours}
                ours = [k for kv, k in fresh.items() if kv not in self._found]
                self._found.update(fresh)
        if ours and self._pool is not None:
            with self._lock:
                future = self._pool.submit(self._mark, ours)
                self._pending.add(future)
            future.add_done_callback(self._pending.discard)

    def _ours(self, key: ObjectKeyLike) -> bool:
        models = self._chunks.get((key.cache_salt, bytes(key.chunk_hash)))
        return models is not None and (None in models or key.model_name in models)

    def _mark(self, keys: list[ObjectKeyLike]) -> None:
        try:  # within each tenant's keep budget; a refusal is counted by the tier
            granted = self._tenancy.keep(keys)
        except Exception as exc:  # a closed chain, a tier down: nothing kept, logged
            log.warning("kvtier: keeping %d prefix chunk(s) failed: %r", len(keys), exc)
            return
        with self._lock:
            self.kept += granted

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the marks asked so far are made."""
        with self._lock:
            pending = list(self._pending)
        wait_futures(pending, timeout=timeout)

    def close(self) -> None:
        """Make the marks asked, then stop the thread (before the chains close)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
