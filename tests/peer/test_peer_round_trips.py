"""The peer tier's data path: round trips, placement over several servers, the zero-copy path
and requests pipelined over one connection."""

from __future__ import annotations

import random
from pathlib import Path

from peer_chain import NS, backend_of, block, chain_of, key, peer_tier, read
from peer_server import PeerServer
from worker_threads import run_workers

from kvtier import Namespace
from kvtier.block.framing import Codec, encode
from kvtier.plugins.registry import BackendRegistry

SIZES = [1, 100, 4096, 65536, 1 << 20, 8 << 20]


# --- round trips ---------------------------------------------------------------------------


def test_round_trip_every_size_through_a_peer_chain(
    server: PeerServer, registry: BackendRegistry
) -> None:
    keys = [key(i) for i in range(len(SIZES))]
    blocks = [block(i, size) for i, size in enumerate(SIZES)]
    with chain_of(registry, peer_tier(server)) as chain:
        assert chain.put(keys, blocks) == [True] * len(keys)
        assert read(chain, keys, SIZES) == blocks
        assert chain.get_bytes([*keys, key(99)]) == [*blocks, None]
        assert chain.lookup([keys[0], key(99)]) == [0, None]
        assert chain.evict([keys[0], key(99)]) == 1
        assert read(chain, keys[:2], SIZES[:2]) == [None, blocks[1]]
        stats = chain.stats()["tiers"][0]
        assert stats["corrupt"] == 0 and stats["healthy"]
        assert stats["backend_stats"]["peers_up"] == 1


def test_round_trip_ram_then_peer_written_through(
    server: PeerServer, registry: BackendRegistry
) -> None:
    ram = {"name": "ram", "backend": "host", "capacity": "64MiB"}
    keys = [key(i) for i in range(len(SIZES))]
    blocks = [block(i, size) for i, size in enumerate(SIZES)]
    with chain_of(registry, ram, peer_tier(server, write="through")) as chain:
        assert chain.put(keys, blocks) == [True] * len(keys)
        chain.flush()
        assert chain.tiers[1].lookup(keys) == [True] * len(keys)
        chain.tiers[0].evict(keys)  # now only the peer has them
        assert chain.lookup(keys) == [1] * len(keys)
        assert read(chain, keys, SIZES) == blocks
        chain.flush()
        assert chain.lookup(keys) == [0] * len(keys)  # promoted back into RAM


def test_two_clients_share_through_one_server(
    server: PeerServer, registry: BackendRegistry
) -> None:
    keys = [key(i) for i in range(8)]
    blocks = [block(i, 10_000 + i) for i in range(8)]
    with chain_of(registry, peer_tier(server)) as writer, \
            chain_of(registry, peer_tier(server)) as reader:
        assert writer.put(keys, blocks) == [True] * 8
        assert read(reader, keys, [len(b) for b in blocks]) == blocks
    other = Namespace("another-model")
    with chain_of(registry, peer_tier(server), namespace=other) as stranger:
        assert stranger.lookup(keys) == [None] * 8  # namespaces never mix


def test_compressed_server_tier_still_round_trips(
    tmp_path: Path, registry: BackendRegistry
) -> None:
    """The server recodes to zstd: sizes differ from the client's, get_into falls back."""
    config = {"chain": [{"name": "ram", "backend": "host", "capacity": "64MiB",
                         "codec": "zstd"}]}
    with PeerServer(tmp_path / "z", config=config) as srv, \
            chain_of(registry, peer_tier(srv)) as chain:
        keys = [key(i) for i in range(4)]
        blocks = [bytes(50_000) + block(i, 100) for i in range(4)]
        assert chain.put(keys, blocks) == [True] * 4
        before = backend_of(chain).kvtier_stats()["requests"]
        assert read(chain, keys, [len(b) for b in blocks]) == blocks
        # one GET: the blocks that did not fit the scatter lists were kept for the fallback
        assert backend_of(chain).kvtier_stats()["requests"] == before + 1


# --- placement -----------------------------------------------------------------------------


def test_hash_placement_puts_each_key_on_one_server_and_all_on_both(
    tmp_path: Path, registry: BackendRegistry
) -> None:
    keys = [key(i) for i in range(64)]
    blocks = [block(i, 2000) for i in range(64)]
    sizes = [2000] * 64
    with PeerServer(tmp_path / "a") as a, PeerServer(tmp_path / "b") as b:
        with chain_of(registry, peer_tier(a, b)) as both:
            assert both.put(keys, blocks) == [True] * 64
            assert read(both, keys, sizes) == blocks
        with chain_of(registry, peer_tier(a)) as only_a, \
                chain_of(registry, peer_tier(b)) as only_b:
            on_a = [w == 0 for w in only_a.lookup(keys)]
            on_b = [w == 0 for w in only_b.lookup(keys)]
            assert all(x != y for x, y in zip(on_a, on_b))  # exactly one server each
            assert 0 < sum(on_a) < 64
            counts = {}
            for chain in (only_a, only_b):
                (stats,) = backend_of(chain).server_stats().values()
                assert stats is not None
                ram = stats["namespaces"][NS.hex]["tiers"][0]
                counts[chain] = ram["backend_stats"]["blocks"]
            assert list(counts.values()) == [sum(on_a), sum(on_b)]

        replicated = Namespace("replicated")
        with chain_of(registry, peer_tier(a, b, placement="all"),
                      namespace=replicated) as both:
            assert both.put(keys, blocks) == [True] * 64
        for srv in (a, b):
            with chain_of(registry, peer_tier(srv), namespace=replicated) as one:
                assert one.lookup(keys) == [0] * 64
                assert read(one, keys, sizes) == blocks


def test_all_placement_serves_from_the_peer_still_up(
    tmp_path: Path, registry: BackendRegistry
) -> None:
    keys = [key(i) for i in range(16)]
    blocks = [block(i, 3000) for i in range(16)]
    with PeerServer(tmp_path / "a") as a, PeerServer(tmp_path / "b") as b, \
            chain_of(registry, peer_tier(a, b, placement="all", request_timeout="5s")) as chain:
        assert chain.put(keys, blocks) == [True] * 16
        a.stop()
        assert read(chain, keys, [3000] * 16) == blocks
        assert chain.lookup(keys) == [0] * 16
        assert chain.stats()["tiers"][0]["backend_stats"][f"peer.{a.address}.up"] == 0


# --- the zero-copy path and pipelining -----------------------------------------------------


def test_get_into_fills_the_callers_buffers_exactly(
    server: PeerServer, registry: BackendRegistry
) -> None:
    with chain_of(registry, peer_tier(server)) as chain:
        backend = backend_of(chain)
        keys = [key(i) for i in range(3)]
        blobs = [encode(NS.fingerprint, k, block(i, 5000 + i), Codec()) for i, k in
                 enumerate(keys)]
        parts = [[b[:10], b[10:]] for b in blobs]
        assert list(backend.kvtier_put_parts(keys, parts, [])) == [True] * 3
        heads = [bytearray(100) for _ in blobs]
        bodies = [bytearray(len(b) - 100) for b in blobs]
        scatter = [[memoryview(h), memoryview(d)] for h, d in zip(heads, bodies)]
        sizes = backend.kvtier_get_into([*keys, key(9)], [*scatter, [memoryview(bytearray(8))]])
        assert list(sizes) == [len(b) for b in blobs] + [None]
        assert [bytes(h + d) for h, d in zip(heads, bodies)] == blobs
        # a block of another size is reported, and handed to the following get
        wrong = [[memoryview(bytearray(len(blobs[0]) + 1))]]
        assert list(backend.kvtier_get_into(keys[:1], wrong)) == [len(blobs[0])]
        before = backend.kvtier_stats()["requests"]
        assert [bytes(b) for b in backend.kvtier_get(keys[:1]) if b] == blobs[:1]
        assert backend.kvtier_stats()["requests"] == before


def test_threads_pipeline_over_one_connection(
    server: PeerServer, registry: BackendRegistry
) -> None:
    errors: list[str] = []
    with chain_of(registry, peer_tier(server, connections=1)) as chain:

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(40):
                i = rng.randrange(32)
                size = 1000 + i * 3001
                if rng.random() < 0.4:
                    if chain.put([key(i)], [block(i, size)]) != [True]:
                        errors.append(f"put {i} refused")
                else:
                    got = read(chain, [key(i)], [size])[0]
                    if got is not None and got != block(i, size):
                        errors.append(f"key {i}: wrong bytes")

        run_workers(worker, 8)
        assert errors == []
        stats = chain.stats()["tiers"][0]
        assert stats["errors"] == 0 and stats["corrupt"] == 0


def test_a_batch_beyond_one_frame_is_split_and_pipelined(
    server: PeerServer, registry: BackendRegistry
) -> None:
    keys = [i.to_bytes(4, "big") * 16 for i in range(5000)]  # 64-byte keys
    blocks = [block(i, 64) for i in range(5000)]
    with chain_of(registry, peer_tier(server, connections=1)) as chain:
        assert chain.put(keys, blocks) == [True] * 5000
        assert read(chain, keys, [64] * 5000) == blocks
        stats = backend_of(chain).kvtier_stats()
        # 5000 keys of 64 bytes need several requests, written before the first reply
        assert stats["pipelined"] > 0


def test_blocks_beyond_max_payload_are_refused_not_sent(
    tmp_path: Path, server: PeerServer, registry: BackendRegistry
) -> None:
    blocks = [block(1, 100_000), block(2, 1000)]
    with chain_of(registry, peer_tier(server, max_payload="64KiB")) as chain:
        assert chain.put([key(1), key(2)], blocks) == [False, True]
        assert read(chain, [key(2)], [1000]) == [block(2, 1000)]
    # the server's limit is smaller than the client's: the handshake settles on it
    with PeerServer(tmp_path / "small", args=("--max-payload", "64KiB")) as small, \
            chain_of(registry, peer_tier(small)) as chain:
        assert chain.put([key(1), key(2)], blocks) == [False, True]
        many = [block(i, 30_000) for i in range(3, 10)]  # 210 kB: several frames each way
        assert chain.put([key(i) for i in range(3, 10)], many) == [True] * 7
        assert read(chain, [key(i) for i in range(3, 10)], [30_000] * 7) == many
        assert chain.stats()["tiers"][0]["errors"] == 0
