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

from collections.abc import Mapping
from typing import Any

from kvtier import Chain, Namespace, open_chain
from kvtier.spec import Option, hookimpl
from kvtier.testing.through_chain import ChainAsBackend


def _positive(value: int) -> None:
    """The host tier's capacity, refused here (with the option's name) rather than by the chain."""
    if value <= 0:
        raise ValueError("must be a positive size")

class ChainBackend(ChainAsBackend):
    """RAM (``host``, capacity ``ram``) over ``fs`` at ``url``, written ``disk_write``.

    Subclasses change the chain through :meth:`_chain_config` and
    :meth:`_persists` and declare their options in ``kvtier_options``.
    """

    @hookimpl
    def kvtier_options(self) -> Mapping[str, Option]:
        return {
            "url": Option("str", "fs tier URL (file:///path or memory://name)", required=True),
            "ram": Option("size", "capacity of the host tier", default="256KiB", check=_positive),
            "disk_write": Option(
                "str", "write policy of the fs tier", "back", choices=("back", "through")
            ),
            "settle": Option(
                "bool", "wait for the chain's background writes after put and get", True
            ),
        }

    def _open(self, options: Mapping[str, Any], namespace: Namespace) -> tuple[Chain, bool]:
        chain = open_chain({"chain": self._chain_config(options)}, namespace=namespace)
        return chain, self._persists(options)

    def _chain_config(self, options: Mapping[str, Any]) -> list[dict[str, Any]]:
        ram = {"name": "ram", "backend": "host", "capacity": options["ram"]}
        disk = {"name": "disk", "backend": "fs", "url": options["url"]}
        return [ram, {**disk, "write": options["disk_write"]}]

    def _persists(self, options: Mapping[str, Any]) -> bool:
        # write-back keeps the newest blocks in RAM only: close loses them
        return options["disk_write"] == "through" and not options["url"].startswith("memory://")


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
            "ram": Option("size", "capacity of a host tier above the peer tier; unset: none",
                          check=_positive),
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
