"""A client reading into a buffer of the wrong size leaves the serving node's block in
place for every other client (the chain's side: ``tests/chain/test_wrong_size_reads.py``)."""

from __future__ import annotations

from peer_chain import NS, backend_of, block, chain_of, key, peer_tier, read
from peer_server import PeerServer

from kvtier.plugins.registry import BackendRegistry

SIZES = [4096, 1 << 20]


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
        (served,) = backend_of(right).server_stats().values()
        assert served is not None
        node = served["namespaces"][NS.hex]["tiers"]
        assert [tier["backend_stats"]["blocks"] for tier in node] == [len(keys)] * 2
