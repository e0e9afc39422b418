"""The client side of the peer tests: chains with a ``peer`` tier, keys, blocks, reads.

``tests/peer/test_peer_{round_trips,auth_and_options,faults}.py`` test the peer
tier, `kvtier serve` (:class:`peer_server.PeerServer`) on one side, the `peer`
backend on the other; their ``registry`` and ``server`` fixtures are in
``tests/peer/conftest.py``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from peer_server import PeerServer

import kvtier
from kvtier import Namespace, open_chain
from kvtier.backends.peer import PeerBackend
from kvtier.plugins.registry import BackendRegistry

NS = Namespace("peer-test", dtype="bfloat16", tokens_per_block=16)


def key(i: int) -> bytes:
    return b"peer-key-" + i.to_bytes(4, "big")


def block(i: int, size: int) -> bytes:
    return random.Random(i * 7919 + size).randbytes(size)


def read(chain: kvtier.Chain, keys: Sequence[bytes], sizes: Sequence[int]) -> list[bytes | None]:
    outs = [bytearray(size) for size in sizes]
    found = chain.get(keys, outs)
    return [bytes(o) if f else None for o, f in zip(outs, found)]


def peer_tier(*servers: PeerServer | str, name: str = "peer", **options: Any) -> dict[str, Any]:
    peers = [s if isinstance(s, str) else s.address for s in servers]
    return {"name": name, "backend": "peer", "peers": peers, **options}


def backend_of(chain: kvtier.Chain, index: int = 0) -> PeerBackend:
    instance = chain.tiers[index].handle.instance
    assert isinstance(instance, PeerBackend)
    return instance


def chain_of(registry: BackendRegistry, *tiers: dict[str, Any],
             namespace: Namespace = NS) -> kvtier.Chain:
    return open_chain({"chain": list(tiers)}, namespace=namespace, registry=registry)
