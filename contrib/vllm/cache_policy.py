"""kvtier's eviction policies as vLLM ``CachePolicy`` classes, for vLLM's own CPU tier.

vLLM's CPU tier (the primary tier of its ``OffloadingConnector``) takes an
out-of-tree policy by class name and module::

    "eviction_policy": "S3FifoCachePolicy",
    "cache_policy_module_path": "kvtier.contrib.vllm.cache_policy"

and a kvtier YAML whose leading ``host`` tier says ``eviction: s3fifo`` (or
``adaptive``) sets both (:func:`kvtier.contrib.vllm.args.primary_settings`).
Each class wraps the very object the host tier runs
(:func:`kvtier.policies.new_policy`): the decisions are kvtier's,
vLLM keeps the chunks.  vLLM's chunks are all one size, so every block
weighs one unit and the policy's capacity is vLLM's ``cache_capacity`` in
chunks.

How vLLM's calls map onto the policy:

* ``insert`` admits the key (a store); vLLM frees the chunks first, so the
  policy never has to evict to admit.
* A use is a chunk a finished request reused (``reused_keys`` of
  ``on_request_finished``, the prompt's head last so it is the most recent),
  or a ``touch`` of a ready chunk.  Chunks a request only inserted are not
  used again by it, as in vLLM's ARC.
* ``evict(n, protected)`` returns ``None`` with nothing changed when fewer
  than ``n`` chunks are evictable (reference count 0, set by vLLM through
  ``mark_evictable``) and not ``protected``.  Otherwise it asks the policy
  for victims in its own order (``make_room``).  A victim vLLM may not drop
  now (being stored or loaded, or offered by the request being stored)
  stays in vLLM's cache *outside* the policy: it is the first to leave at
  the next eviction that may take it, unless a request uses it before, which
  admits it again as the policy admits a block it recently evicted (for
  ``s3fifo`` and ``arc``, a ghost hit: it joins the frequent queue).
* ``remove`` (a failed store) forgets the key; ``clear`` starts afresh.

With nothing pinned, vLLM evicts exactly what the host tier's policy object
would, store for store, for ``lru``, ``s3fifo`` and ``adaptive`` (the tests
check it).  ``arc`` differs in one step: vLLM makes room before it inserts,
so the eviction for a key found among ARC's ghosts runs before that ghost
hit moves ``p``.

:meth:`KvtierCachePolicy.stats` counts hits (reused chunks), inserts,
evictions and victims put off; :func:`live_policies` finds the instances of
this process.  Importing this module imports vLLM.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import (
    CachePolicy,
    ChunkStatus,
    order_request_keys,
)

from kvtier.policies import Policy, new_policy

__all__ = [
    "POLICY_CLASSES",
    "AdaptiveCachePolicy",
    "ArcCachePolicy",
    "KvtierCachePolicy",
    "LruCachePolicy",
    "S3FifoCachePolicy",
    "live_policies",
]

#: Every chunk weighs one unit in the policy: vLLM's chunks are one size.
_UNIT = 1

_live: weakref.WeakSet[KvtierCachePolicy] = weakref.WeakSet()


def live_policies() -> list[KvtierCachePolicy]:
    """The kvtier cache policies vLLM built in this process (for in-process inspection)."""
    return list(_live)


class KvtierCachePolicy(CachePolicy):  # type: ignore[misc, unused-ignore]
    """A vLLM ``CachePolicy`` that follows one of kvtier's eviction policies (module docstring)."""

    #: The kvtier ``eviction`` name this class runs.
    eviction: ClassVar[str] = "lru"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._chunks: dict[OffloadKey, ChunkStatus] = {}
        self._evictable: set[OffloadKey] = set()
        # resident in vLLM, already let go by the policy, oldest first
        self._outside: OrderedDict[OffloadKey, None] = OrderedDict()
        self._policy: Policy = new_policy(self.eviction, max(1, cache_capacity))
        self.hits = 0
        self.inserts = 0
        self.evictions = 0
        self.deferred = 0
        _live.add(self)

    # --- what vLLM asks -------------------------------------------------------

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self._chunks.get(key)

    def insert(
        self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext | None = None
    ) -> None:
        """Admit a newly allocated chunk (``req_context`` is passed from vLLM 0.33 on)."""
        self._chunks[key] = chunk
        if chunk.ref_cnt == 0:
            self._evictable.add(key)
        self.inserts += 1
        self._admit(key)

    def remove(self, key: OffloadKey) -> None:
        del self._chunks[key]
        self._evictable.discard(key)
        if key in self._outside:
            del self._outside[key]
        else:
            self._policy.remove(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            self._use(key)

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """Nothing: kvtier's policies learn from their ghosts when the key is inserted."""

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        for key in reversed(order_request_keys(key_groups, req_context)):
            if key in reused_keys:
                self._use(key)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n <= 0:
            return []
        evictable = self._evictable
        free = len(evictable) - sum(1 for key in protected if key in evictable)
        if free < n:
            return None  # nothing changed
        victims: list[OffloadKey] = []
        for key in list(self._outside):
            if len(victims) == n:
                break
            if key in evictable and key not in protected:
                del self._outside[key]
                victims.append(key)
        while len(victims) < n:  # free >= n: the policy reaches enough evictable chunks
            dropped = self._policy.make_room(_UNIT)
            if not dropped:
                raise RuntimeError("vLLM's evictable chunks and the policy's disagree")
            for dropped_key in dropped:
                key = OffloadKey(dropped_key)
                if key in evictable and key not in protected:
                    victims.append(key)
                else:
                    self._outside[key] = None
                    self.deferred += 1
        out: list[tuple[OffloadKey, ChunkStatus]] = []
        for key in victims:
            evictable.discard(key)
            out.append((key, self._chunks.pop(key)))
        self.evictions += len(out)
        return out

    def clear(self) -> None:
        self._chunks.clear()
        self._evictable.clear()
        self._outside.clear()
        self._policy = new_policy(self.eviction, max(1, self.cache_capacity))

    def mark_evictable(self, key: OffloadKey) -> None:
        self._evictable.add(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._evictable.discard(key)

    # --- what kvtier reports --------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Chunks held, hits (chunks requests reused), inserts, evictions, victims put off."""
        return {
            "eviction": self.eviction,
            "capacity_chunks": self.cache_capacity,
            "chunks": len(self._chunks),
            "outside": len(self._outside),
            "hits": self.hits,
            "inserts": self.inserts,
            "evictions": self.evictions,
            "deferred": self.deferred,
            **self._policy.stats(),
        }

    # --- the policy -----------------------------------------------------------

    def _admit(self, key: OffloadKey) -> None:
        # a miss, then a store, as the host tier sees a get and a put: the
        # miss is a reference for adaptive's miniatures (False for the others)
        self._policy.access(key)
        # vLLM frees chunks before it inserts, so nothing is evicted here; if something is,
        # it stays in vLLM's cache outside the policy
        for victim in self._policy.admit(key, _UNIT):
            self._outside[OffloadKey(victim)] = None

    def _use(self, key: OffloadKey) -> None:
        chunk = self._chunks.get(key)
        if chunk is None or not chunk.is_ready:
            return  # a chunk still being stored is not used twice
        self.hits += 1
        if key in self._outside:
            del self._outside[key]
            self._admit(key)
        else:
            self._policy.access(key)


class LruCachePolicy(KvtierCachePolicy):
    """kvtier's ``lru`` (vLLM's own ``lru`` is the same policy, built in)."""

    eviction = "lru"


class ArcCachePolicy(KvtierCachePolicy):
    """kvtier's ``arc``: the paper's ghost adaptation at insert (vLLM's ``arc`` differs)."""

    eviction = "arc"


class S3FifoCachePolicy(KvtierCachePolicy):
    """kvtier's ``s3fifo``: chunks used once leave from a small queue."""

    eviction = "s3fifo"


class AdaptiveCachePolicy(KvtierCachePolicy):
    """kvtier's ``adaptive``: follows whichever of lru, arc, s3fifo hits most lately."""

    eviction = "adaptive"


#: kvtier ``eviction`` name -> the class vLLM loads for it.
POLICY_CLASSES: dict[str, type[KvtierCachePolicy]] = {
    cls.eviction: cls
    for cls in (LruCachePolicy, ArcCachePolicy, S3FifoCachePolicy, AdaptiveCachePolicy)
}
