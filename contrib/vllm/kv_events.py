"""vLLM's KV events of a kvtier tier: the chunks its chains stored and no longer hold.

With vLLM's KV cache events on, the tier listens to each chain it opens (one
per tenant, :mod:`.tenancy`) and reports through ``take_events`` the chunks
vLLM stored in a chain and those no kvtier tier of that chain holds any more
(capacity evictions in any tier, evictions, purges), as ``OffloadingEvent``
with ``Medium.STORAGE``.
"""

from __future__ import annotations

import functools
from collections import deque
from typing import Any, cast

from kvtier.chain import Chain, ChainEvent
from kvtier.spec import KvtierError

from ._compat import OffloadingEvent

__all__ = ["ChainEvents"]


class ChainEvents:
    """The events of a tier's chains, queued for ``take_events``; chain threads add to it."""

    def __init__(self, medium: Any, locality: Any) -> None:
        self._medium, self._locality = medium, locality
        self._queue: deque[Any] = deque()
        #: digest -> vLLM key, for the keys a chain knows by their digest
        self.long_keys: dict[bytes, bytes] = {}

    def listen(self, chain: Chain) -> None:
        """Report ``chain``'s stores and removals from now on."""
        chain.add_listener(functools.partial(self._on_chain_event, chain))

    def _on_chain_event(self, chain: Chain, event: ChainEvent) -> None:
        """A chain's store or removal, as vLLM's ``OffloadingEvent`` (chain threads).

        vLLM sees the chain as one tier: a block is stored when vLLM's store
        lands in the chain (not again when it is copied between kvtier
        tiers), and removed when no kvtier tier holds it any more (a capacity
        victim demoted below, or still held above a lower tier that evicted
        it, stays).
        """
        keys = list(event.keys)
        if event.kind == "stored":
            if event.reason != "put":
                return
        else:
            try:
                where = chain.lookup(keys)
            except KvtierError:  # closing: nothing more to say
                return
            keys = [k for k, tier in zip(keys, where) if tier is None]
        keys = [self.long_keys.get(k, k) for k in keys]
        if keys:
            self._queue.append(OffloadingEvent(
                keys=cast(Any, keys), medium=self._medium, removed=event.kind == "removed",
                locality=self._locality,
            ))

    def take(self) -> list[Any]:
        """The events queued since the last call."""
        taken = []
        while self._queue:
            taken.append(self._queue.popleft())
        return taken
