"""What a chain stores and removes, told to listeners (KV-aware routers, adapters).

A listener is any callable taking one :class:`ChainEvent`; register it with
:meth:`kvtier.Chain.add_listener`.  It is called on the thread that changed
the tier (the caller's for a first-tier put and for ``evict``, a tier's
writer thread for write-through copies, demotions and promotions), after the
change, with no chain lock held.  It must be quick and must not raise: an
exception is logged and dropped, never seen by the chain's caller.

Each event carries ``load_s``: what loading a usual block from its tier is
expected to take now (the 0.9 quantile of the tier's fitted read time,
:mod:`kvtier.chain.cost`; 0.0 while the tier is unmeasured), so that a router
can weigh where a block lives, not only whether it is cached; and
``recompute_s``, what recomputing a block's tokens is expected to take (0.0
without a model), with ``recompute_source`` (``configured``, ``learned`` or
``none``, :mod:`kvtier.chain.learned_cost`) and ``recompute_samples`` (the timed
recomputes a learned model holds): what ``load_s`` is weighed against;
and ``load_source``, what measured the tier last (``load``, ``probe``,
``read-back``, ``kept ...`` for a fit an earlier process kept, or ``none``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["ChainEvent", "ChainListener", "Listeners"]

log = logging.getLogger("kvtier.chain")

#: Why blocks entered a tier: ``put`` (the chain's caller stored them),
#: ``through`` (copied down by a write-through tier), ``demote`` (a capacity
#: victim of the tier above), ``promote`` (copied up on a hit).  Why they
#: left: ``capacity`` (the backend evicted them for room), ``evict``
#: (:meth:`~kvtier.Chain.evict`), ``purge`` (an operator's purge), or any
#: other reason a reporter names through :meth:`~kvtier.Chain.report_removed`.
Reason = str


@dataclass(frozen=True)
class ChainEvent:
    """Blocks that entered (``stored``) or left (``removed``) one tier of a chain."""

    kind: Literal["stored", "removed"]
    tier: str
    tier_index: int
    keys: tuple[bytes, ...]
    reason: Reason
    #: Expected seconds to load a usual block from the tier (0.0: not measured yet).
    load_s: float = 0.0
    #: Expected seconds to recompute a block's tokens (0.0: no model), and the model's source.
    recompute_s: float = 0.0
    recompute_source: str = "none"
    #: What measured the tier last (:attr:`kvtier.chain.cost.LoadCost.source`).
    load_source: str = "none"
    #: Timed recomputes the learned model holds (``learned from N samples``).
    recompute_samples: int = 0


ChainListener = Callable[[ChainEvent], None]


class Listeners:
    """A thread-safe set of listeners; :meth:`emit` calls each in turn."""

    def __init__(self, block_load: Callable[[int], tuple[float, str]] | None = None,
                 block_recompute: Callable[[], tuple[float, str, int]] | None = None) -> None:
        """``block_load(tier_index)``: ``load_s``, the tier's expected block load time, and
        ``load_source``, what measured it;
        ``block_recompute()``: ``recompute_s``, ``recompute_source`` and
        ``recompute_samples``."""
        self._lock = threading.Lock()
        self._listeners: tuple[ChainListener, ...] = ()
        self._block_load = block_load
        self._block_recompute = block_recompute

    def add(self, listener: ChainListener) -> None:
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def remove(self, listener: ChainListener) -> None:
        with self._lock:
            self._listeners = tuple(fn for fn in self._listeners if fn is not listener)

    def __bool__(self) -> bool:
        return bool(self._listeners)

    def emit(
        self, kind: Literal["stored", "removed"], tier: str, index: int,
        keys: Iterable[bytes], reason: Reason,
    ) -> None:
        listeners = self._listeners
        if not listeners:
            return
        keys = tuple(keys)
        if not keys:
            return
        load = self._block_load(index) if self._block_load is not None else (0.0, "none")
        redo = (self._block_recompute() if self._block_recompute is not None
                else (0.0, "none", 0))
        event = ChainEvent(kind, tier, index, keys, reason, load_s=load[0],
                           recompute_s=redo[0], recompute_source=redo[1],
                           load_source=load[1], recompute_samples=redo[2])
        for listener in listeners:
            try:
                listener(event)
            except Exception:  # a listener's fault is never the chain caller's
                log.exception("kvtier: chain listener %r failed", listener)
