"""Backends made of a whole chain, so the conformance kit can certify chains too.

:class:`ChainBackend` opens a two-tier chain, a small ``host`` RAM tier over
an ``fs`` tier, and serves the backend hooks with :meth:`Chain.put`,
:meth:`Chain.get_bytes`, :meth:`Chain.lookup` and :meth:`Chain.evict`.  The
kit then checks the chain's promotion, demotion and write policies through
the same contract as any single store.

:class:`PeerChainBackend` does the same with a chain whose (last) tier is a
``peer`` tier, to certify the peer path: client backend, wire protocol and a
live ``kvtier serve``.  The ``peer`` backend cannot be certified bare: the
server stores only blocks framed by a chain of the connection's namespace
(it checks the block header and refuses anything else), and the kit puts
raw bytes.  Through a chain, every block the kit puts is framed on the way
out and checked on the way back, which is how peers are used.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, MutableSequence, Sequence
from typing import Any

from kvtier import Chain, Namespace, open_chain
from kvtier.spec import BytesLike, Capabilities, ClosedError, Option, hookimpl


class ChainBackend:
    """RAM (``host``, capacity ``ram``) over ``fs`` at ``url``, written ``disk_write``.

    Subclasses change the chain through :meth:`_chain_config` and
    :meth:`_persists` and declare their options in ``kvtier_options``.
    """

    def __init__(self) -> None:
        self._chain: Chain | None = None
        self._settle = True
        self._closed = False
        self._persistent = False
        self._lock = threading.Lock()

    @hookimpl
    def kvtier_options(self) -> Mapping[str, Option]:
        return {
            "url": Option("str", "fs tier URL (file:///path or memory://name)", required=True),
            "ram": Option("size", "capacity of the host tier", default="256KiB"),
            "disk_write": Option(
                "str", "write policy of the fs tier", "back", choices=("back", "through")
            ),
            "settle": Option(
                "bool", "wait for the chain's background writes after put and get", True
            ),
        }

    @hookimpl
    def kvtier_open(self, options: Mapping[str, Any], namespace: str) -> None:
        if self._closed:
            raise ClosedError("chain backend is closed")
        config = {"chain": self._chain_config(options)}
        self._chain = open_chain(config, namespace=Namespace.from_hex(namespace))
        self._settle = options["settle"]
        self._persistent = self._persists(options)

    def _chain_config(self, options: Mapping[str, Any]) -> list[dict[str, Any]]:
        ram = {"name": "ram", "backend": "host", "capacity": options["ram"]}
        disk = {"name": "disk", "backend": "fs", "url": options["url"]}
        return [ram, {**disk, "write": options["disk_write"]}]

    def _persists(self, options: Mapping[str, Any]) -> bool:
        # write-back keeps the newest blocks in RAM only: close loses them
        return options["disk_write"] == "through" and not options["url"].startswith("memory://")

    def _live(self) -> Chain:
        if self._chain is None or self._closed:
            raise ClosedError("chain backend is closed" if self._closed else "not open")
        return self._chain

    @hookimpl
    def kvtier_capabilities(self) -> Capabilities:
        self._live()
        return Capabilities(persistent=self._persistent, thread_safe=True)

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
        # the last tier is unbounded (fs, or the server's chain behind a peer
        # tier, which ends in fs in the tests): the chain as a whole evicts nothing
        del evicted
        chain = self._live()
        stored = chain.put(keys, blocks)
        if self._settle:
            # A block the RAM tier evicts is demoted asynchronously and reads as
            # a miss until the demotion lands; a backend promises read-your-writes.
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


class PeerChainBackend(ChainBackend):
    """A chain ending in a ``peer`` tier on the ``kvtier serve`` at ``peer``.

    With ``ram`` set, a ``host`` tier of that capacity sits above the peer
    tier, which is then written through; without it the peer tier is alone.
    Whether blocks outlive a reopen of this client depends on the server's
    chain (a server whose chain writes through to disk keeps them; one with
    RAM alone may drop a namespace it closes), which the client cannot see:
    whoever started the server says so with ``persistent``.
    """

    @hookimpl
    def kvtier_options(self) -> Mapping[str, Option]:
        return {
            "peer": Option("str", "HOST:PORT of a running kvtier serve", required=True),
            "secret": Option("str", "the server's shared secret", default=None, secret=True),
            "ram": Option("size", "capacity of a host tier above the peer tier; unset: none"),
            "persistent": Option(
                "bool", "the server's chain keeps blocks across this client's reopen", False
            ),
            "settle": Option(
                "bool", "wait for the chain's background writes after put and get", True
            ),
        }

    def _chain_config(self, options: Mapping[str, Any]) -> list[dict[str, Any]]:
        peer: dict[str, Any] = {"name": "peer", "backend": "peer", "peers": [options["peer"]]}
        if options["secret"] is not None:
            peer["secret"] = options["secret"]
        if options["ram"] is None:
            return [peer]
        ram = {"name": "ram", "backend": "host", "capacity": options["ram"]}
        # through, not back: a block only this client's RAM holds dies with a reopen
        return [ram, {**peer, "write": "through"}]

    def _persists(self, options: Mapping[str, Any]) -> bool:
        return bool(options["persistent"])
