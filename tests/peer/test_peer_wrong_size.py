"""A client reading into a buffer of the wrong size leaves the serving node's block in
place for every other client (the chain's side: ``tests/chain/test_wrong_size_reads.py``)."""

from __future__ import annotations

import time
from typing import Any

from peer_chain import NS, backend_of, block, chain_of, key, peer_tier, read
from peer_server import PeerServer

import kvtier
from kvtier.plugins.registry import BackendRegistry

SIZES = [4096, 1 << 20]


def settled_node(chain: kvtier.Chain, timeout: float = 30) -> dict[str, Any]:
    """The serving node's figures for the namespace once its queued writes have landed:
    its RAM tier writes through to its disk tier asynchronously, so the disk holds a
    block some time after the put's answer (under load, after every read here)."""
    deadline = time.monotonic() + timeout
    while True:
        (served,) = backend_of(chain).server_stats().values()
        assert served is not None
        node: dict[str, Any] = served["namespaces"][NS.hex]
        if node["pending_writes"] == 0 or time.monotonic() > deadline:
            return node
        time.sleep(0.01)


def test_a_read_into_a_buffer_of_another_size_leaves_the_block_for_every_client(
    server: PeerServer, registry: BackendRegistry
) -> None:
    keys = [key(i) for i in range(len(SIZES))]
    blocks = [block(i, size) for i, size in enumerate(SIZES)]
    with chain_of(registry, peer_tier(server)) as wrong, \
            chain_of(registry, peer_tier(server)) as right:
        assert wrong.put(keys, blocks) == [True] * len(keys)
        for factor in (2, 0.5):
            sizes = [int(size * factor) for size in SIZES]
            assert read(wrong, keys, sizes) == [None] * len(keys)
        assert read(right, keys, SIZES) == blocks
        assert right.get_bytes(keys) == blocks
        assert wrong.get_bytes(keys) == blocks
        stats = wrong.stats()["tiers"][0]
        assert (stats["corrupt"], stats["size_mismatch"]) == (0, 2 * len(keys))
        node = settled_node(right)
        assert node["pending_writes"] == 0
        assert [tier["backend_stats"]["blocks"] for tier in node["tiers"]] == [len(keys)] * 2
