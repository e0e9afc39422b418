"""A chain of one tier as a backend, for certifying backends that store only framed blocks.

Some backends keep only what a chain writes: the ``peer`` backend's server
checks every block's header against the connection's namespace and refuses
anything else, while the kit puts raw bytes.  Such a backend declares
``Capabilities(framed_only=True)``, and ``kvtier conformance`` then runs the
kit's ``framed`` group on it and every other group on :class:`ChainOfOne`
instead: a chain of that one backend, served through :meth:`Chain.put`,
:meth:`Chain.get_bytes`, :meth:`Chain.lookup`, :meth:`Chain.evict`,
:meth:`Chain.keep` and :meth:`Chain.expire`, so that every block is framed
on the way out and checked on the way back, as on a node.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, MutableSequence, Sequence
from typing import Any

from kvtier import Chain, Namespace, open_chain
from kvtier.plugins.registry import BackendHandle
from kvtier.spec import (
    BytesLike,
    Capabilities,
    ClosedError,
    KvtierError,
    Option,
    earliest_deadlines,
    hookimpl,
)
from kvtier.testing.groups import CHAIN_OF_ONE
from kvtier.testing.resolve import resolve_backend

__all__ = ["CHAIN_OF_ONE", "ChainAsBackend", "ChainOfOne", "framed_only"]


def framed_only(handle: BackendHandle) -> bool:
    """Whether a backend declares :attr:`Capabilities.framed_only <kvtier.spec.Capabilities>`.

    Asked of an instance that was never opened, which answers for its default
    options (the contract's rule); one that cannot answer then declares nothing.
    """
    try:
        return handle.capabilities().framed_only
    except KvtierError:
        return False


class ChainAsBackend:
    """A whole chain served through the backend hooks, so the kit can certify it.

    ``put`` is :meth:`Chain.put`, ``get`` :meth:`Chain.get_bytes`, ``lookup``,
    ``evict``, ``keep`` (:meth:`Chain.keep`, :meth:`Chain.release`) and
    ``expire`` the chain's own; ``deadlines`` the earliest its tiers answer.
    Subclasses declare their options in ``kvtier_options`` and open the chain in
    :meth:`_open`; an option ``settle`` (true) makes put and get wait for the
    chain's background writes, for chains whose demotions would otherwise read
    as misses meanwhile.
    """

    def __init__(self) -> None:
        self._chain: Chain | None = None
        self._settle = False
        self._closed = False
        self._persistent = False
        self._shared = False
        self._lock = threading.Lock()

    def _open(self, options: Mapping[str, Any], namespace: Namespace) -> tuple[Chain, bool]:
        """The chain to serve, and whether its blocks outlive a reopen."""
        raise NotImplementedError

    @hookimpl
    def kvtier_open(self, options: Mapping[str, Any], namespace: str) -> None:
        if self._closed:
            raise ClosedError("chain backend is closed")
        self._chain, self._persistent = self._open(options, Namespace.from_hex(namespace))
        # one store for every instance only if each tier is: a private tier
        # (RAM) would keep serving a block another instance evicted
        self._shared = all(tier.capabilities.shared for tier in self._chain.tiers)
        self._settle = bool(options.get("settle", False))

    def _live(self) -> Chain:
        if self._chain is None or self._closed:
            raise ClosedError("chain backend is closed" if self._closed else "not open")
        return self._chain

    @hookimpl
    def kvtier_capabilities(self) -> Capabilities:
        if self._closed:
            raise ClosedError("chain backend is closed")
        # never opened: the defaults, the flags below still False
        return Capabilities(persistent=self._persistent, shared=self._shared, thread_safe=True)

    @hookimpl
    def kvtier_close(self) -> None:
        with self._lock:
            chain, self._closed = self._chain, True
        if chain is not None:
            chain.close()

    @hookimpl
    def kvtier_put(
        self,
        keys: Sequence[bytes],
        blocks: Sequence[BytesLike],
        evicted: MutableSequence[tuple[bytes, BytesLike]],
    ) -> list[bool]:
        # declared without a capacity: the chain as a whole reports no victims
        del evicted
        chain = self._live()
        stored = chain.put(keys, blocks)
        if self._settle:
            # a block a RAM tier evicts is demoted asynchronously and reads as
            # a miss until the demotion lands; a backend promises read-your-writes
            chain.flush()
        return stored

    @hookimpl
    def kvtier_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        chain = self._live()
        found = chain.get_bytes(keys)
        if self._settle:
            chain.flush()  # promotions push blocks out of RAM, into the same window
        return found

    @hookimpl
    def kvtier_lookup(self, keys: Sequence[bytes]) -> list[bool]:
        return [where is not None for where in self._live().lookup(keys)]

    @hookimpl
    def kvtier_evict(self, keys: Sequence[bytes]) -> list[bool]:
        chain = self._live()
        # Chain.evict counts; one key at a time gives the per-key answer, and a
        # key repeated in the batch is removed by its first mention
        return [chain.evict([key]) == 1 for key in keys]

    @hookimpl
    def kvtier_keep(self, keys: Sequence[bytes], keep: bool) -> list[bool | None]:
        # Chain.keep and Chain.release answer False for a key no tier holds too:
        # the chain's lookup tells that None apart
        chain = self._live()
        held = [where is not None for where in chain.lookup(keys)]
        answer = chain.keep(keys) if keep else chain.release(keys)
        return [a if h else None for a, h in zip(answer, held, strict=True)]

    @hookimpl
    def kvtier_expire(self, keys: Sequence[bytes], after: float) -> list[bool | None]:
        # as keep: Chain.expire's False for a key no tier holds is None here
        chain = self._live()
        held = [where is not None for where in chain.lookup(keys)]
        answer = chain.expire(keys, after)
        return [a if h else None for a, h in zip(answer, held, strict=True)]

    @hookimpl
    def kvtier_deadlines(self, keys: Sequence[bytes]) -> list[float | None]:
        # the chain has no call for it: the earliest its tiers answer, as a peer server does
        out: list[float | None] = [None] * len(keys)
        for tier in self._live().tiers:
            earliest_deadlines(out, tier.handle.deadlines(keys))
        return out


class ChainOfOne(ChainAsBackend):
    """A chain whose only tier is backend ``tier_backend`` with options ``tier_options``."""

    @hookimpl
    def kvtier_options(self) -> Mapping[str, Option]:
        return {
            "tier_backend": Option("str", "the backend of the chain's one tier", required=True),
            "tier_options": Option("map", "that backend's options", default={}),
        }

    def _open(self, options: Mapping[str, Any], namespace: Namespace) -> tuple[Chain, bool]:
        registry, name = resolve_backend(options["tier_backend"])
        # required: a tier that cannot open fails this open, as a backend's would
        tier = {"required": True, **options["tier_options"], "name": "tier", "backend": name}
        chain = open_chain({"chain": [tier]}, namespace=namespace, registry=registry)
        return chain, chain.tiers[0].capabilities.persistent
