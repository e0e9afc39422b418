"""The peer tier: `kvtier serve` on one side, the `peer` backend on the other."""

from __future__ import annotations

import random
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from peer_server import PeerServer, run_serve

import kvtier
import kvtier.backends._peerwire as peer_wire
import kvtier.chain.tier as tier_module
from kvtier import Namespace, open_chain
from kvtier.backends.peer import PeerBackend
from kvtier.block.framing import Codec, encode
from kvtier.peer import protocol as pp
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import BackendError, ClosedError, ConfigError, ConnectionClosedError, ProtocolError

NS = Namespace("peer-test", dtype="bfloat16", tokens_per_block=16)
SIZES = [1, 100, 4096, 65536, 1 << 20, 8 << 20]
SECRET = "correct horse battery staple"


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


def wait_for(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def registry() -> BackendRegistry:
    reg = BackendRegistry()  # host and fs come from the entry points
    reg.register("peer", PeerBackend)  # until pyproject lists it
    return reg


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PeerServer]:
    with PeerServer(tmp_path / "node") as srv:
        yield srv


@pytest.fixture
def fast_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short back-offs, so tests that wait for a peer to come back wait little."""
    monkeypatch.setattr(tier_module, "_BACKOFF_FIRST", 0.05)
    monkeypatch.setattr(tier_module, "_BACKOFF_MAX", 0.5)
    monkeypatch.setattr(peer_wire, "BACKOFF_MAX", 0.5)


def chain_of(registry: BackendRegistry, *tiers: dict[str, Any],
             namespace: Namespace = NS) -> kvtier.Chain:
    return open_chain({"chain": list(tiers)}, namespace=namespace, registry=registry)


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
        assert list(backend.kvtier_put_parts(keys, [[b[:10], b[10:]] for b in blobs])) == [True] * 3
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

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
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


# --- authentication and refusals -------------------------------------------------------------


def test_secret_right_one_works_wrong_or_none_refused(
    tmp_path: Path, registry: BackendRegistry
) -> None:
    with PeerServer(tmp_path / "s", secret=SECRET) as srv, \
            chain_of(registry, peer_tier(srv, secret=SECRET)) as good:
        assert good.put([key(1)], [block(1, 500)]) == [True]
        with pytest.raises(BackendError, match=r"authentication failed") as wrong:
            chain_of(registry, peer_tier(srv, secret="not the secret"))
        with pytest.raises(BackendError, match=r"requires authentication") as none:
            chain_of(registry, peer_tier(srv))
        for exc in (wrong, none):
            assert srv.address in str(exc.value) and SECRET not in str(exc.value)
        assert read(good, [key(1)], [500]) == [block(1, 500)]  # others still served
        (stats,) = backend_of(good).server_stats().values()
        assert stats is not None and stats["server"]["auth_failures"] >= 2
    assert SECRET not in srv.log()


def test_client_with_secret_refuses_a_server_without_one(
    server: PeerServer, registry: BackendRegistry
) -> None:
    with pytest.raises(BackendError, match=r"does not authenticate"):
        chain_of(registry, peer_tier(server, secret=SECRET))


def test_secret_file_is_accepted(tmp_path: Path, registry: BackendRegistry) -> None:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    with PeerServer(tmp_path / "f", args=("--secret-file", str(path))) as srv, \
            chain_of(registry, peer_tier(srv, secret=SECRET)) as chain:
        assert chain.put([key(1)], [b"x" * 10]) == [True]


def test_listening_beyond_loopback_needs_a_secret(tmp_path: Path) -> None:
    config = tmp_path / "node.yaml"
    config.write_text("chain:\n  - {name: ram, backend: host, capacity: 1MiB}\n")
    done = run_serve(["--config", str(config), "--listen", "0.0.0.0:0"])
    assert done.returncode != 0
    assert "without authentication" in done.stderr and "KVTIER_PEER_SECRET" in done.stderr
    assert "listening" not in done.stdout


def test_protocol_version_mismatch_is_a_clear_error(
    server: PeerServer, registry: BackendRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a HELLO of another version, crafted by hand
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        pp.tune(sock)
        hello = {"t": pp.HELLO, "v": 99, "ns": NS.hex, "n": bytes(32), "a": False, "mp": 1 << 20}
        deadline = time.monotonic() + 10
        pp.send_buffers(sock, [pp.frame(hello)], deadline)
        head, size = pp.FrameReader().read_head(sock, deadline, 0)
        error = pp.parse_message(head, size)
        assert isinstance(error, pp.Error) and error.code == "version"
        assert error.message == "server speaks protocol 1, client 99"
        with pytest.raises(ConnectionClosedError):
            pp.FrameReader().read_head(sock, deadline, 0)
    # and a client of another version says so at open, naming the peer
    monkeypatch.setattr(pp, "PROTOCOL_VERSION", 2)
    with pytest.raises(BackendError, match=r"server speaks protocol 1, this client 2") as exc:
        chain_of(registry, peer_tier(server))
    assert server.address in str(exc.value)


# --- shutdown, faults and recovery -----------------------------------------------------------


def raw_connect(server: PeerServer, namespace: Namespace = NS) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    pp.tune(sock)
    pp.client_handshake(sock, namespace=namespace.hex, secret=None, max_payload=1 << 24,
                        label=server.address, deadline=time.monotonic() + 10)
    return sock


def test_sigterm_finishes_the_request_in_flight(
    tmp_path: Path, registry: BackendRegistry
) -> None:
    srv = PeerServer(tmp_path / "node").start()
    blob = encode(NS.fingerprint, key(1), block(1, 1 << 20), Codec())
    head = pp.frame({"t": pp.PUT, "id": 7, "k": [key(1)], "s": [len(blob)]}, len(blob))
    with raw_connect(srv) as sock:
        deadline = time.monotonic() + 30
        pp.send_buffers(sock, [head, blob[:1000]], deadline)
        time.sleep(0.3)  # let the server start on the frame (not a timing assertion)
        srv.signal(signal.SIGTERM)
        time.sleep(0.3)
        pp.send_buffers(sock, [blob[1000:]], deadline)
        reply = pp.parse_message(*pp.FrameReader().read_head(sock, deadline, 0))
        assert reply == pp.Reply(7, None, [True])
    srv.stop()  # exit code 0
    with PeerServer(tmp_path / "node") as again, chain_of(registry, peer_tier(again)) as chain:
        assert read(chain, [key(1)], [1 << 20]) == [block(1, 1 << 20)]


def test_sigterm_while_a_client_is_mid_batch(server: PeerServer, registry: BackendRegistry) -> None:
    keys = [key(i) for i in range(16)]
    blocks = [block(i, 1 << 20) for i in range(16)]
    errors: list[str] = []
    rounds = threading.Event()
    stop = threading.Event()
    with chain_of(registry, peer_tier(server, request_timeout="5s")) as chain:
        assert chain.put(keys, blocks) == [True] * 16

        def reader() -> None:
            while not stop.is_set():
                got = read(chain, keys, [1 << 20] * 16)
                errors.extend(f"key {i}" for i, g in enumerate(got) if g not in (None, blocks[i]))
                rounds.set()

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            assert rounds.wait(60)
            server.stop()  # SIGTERM mid-batch; asserts a graceful exit 0
        finally:
            stop.set()
            thread.join(60)
        assert not thread.is_alive() and errors == []
        assert read(chain, keys[:1], [1 << 20]) == [None]  # server gone: misses, no error


def test_killed_server_gives_misses_then_recovers(
    tmp_path: Path, registry: BackendRegistry, fast_recovery: None
) -> None:
    disk_only = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/d"}]}
    keys = [key(i) for i in range(64)]
    blocks = [block(i, 2 << 20) for i in range(64)]
    srv = PeerServer(tmp_path / "n", config=disk_only).start()
    try:
        with chain_of(registry, peer_tier(srv)) as writer:
            assert writer.put(keys, blocks) == [True] * 64
        # one connection, opened eagerly: the GET below surely goes out on it
        with chain_of(registry, peer_tier(srv, request_timeout="2s", connections=1)) as chain:
            backend = backend_of(chain)
            sent = backend.kvtier_stats()["requests"]
            result: list[list[bool]] = []
            srv.signal(signal.SIGSTOP)  # frozen: the batch below is surely in flight
            getter = threading.Thread(target=lambda: result.append(
                chain.get(keys, [bytearray(2 << 20) for _ in keys])))
            getter.start()
            wait_for(lambda: backend.kvtier_stats()["requests"] > sent, "the GET to be sent")
            srv.kill()
            getter.join(60)
            assert result == [[False] * 64]
            again = PeerServer(tmp_path / "n", config=disk_only,
                               listen=f"127.0.0.1:{srv.port}").start()
            try:
                wait_for(lambda: chain.get(keys[:2], [bytearray(2 << 20), bytearray(2 << 20)])
                         == [True] * 2,
                         "hits from the restarted server")
                assert read(chain, keys, [2 << 20] * 64) == blocks
                assert backend.kvtier_stats()["reconnects"] >= 1
            finally:
                again.stop()
    finally:
        srv.kill()


def test_a_restarted_server_is_used_at_once(tmp_path: Path, registry: BackendRegistry) -> None:
    """Pooled connections to the old process are found dead and replaced within the call."""
    srv = PeerServer(tmp_path / "r").start()
    with chain_of(registry, peer_tier(srv)) as chain:
        assert chain.put([key(1)], [block(1, 5000)]) == [True]
        srv.stop()
        with PeerServer(tmp_path / "r", listen=srv.address):
            for _ in range(4):  # every pooled connection is stale by now
                assert read(chain, [key(1)], [5000]) == [block(1, 5000)]
        assert chain.stats()["tiers"][0]["errors"] == 0


def test_a_frozen_peer_costs_only_its_own_keys(
    tmp_path: Path, registry: BackendRegistry, fast_recovery: None
) -> None:
    keys = [key(i) for i in range(32)]
    blocks = [block(i, 1000) for i in range(32)]
    with PeerServer(tmp_path / "a") as a, PeerServer(tmp_path / "b") as b:
        with chain_of(registry, peer_tier(a, b)) as writer:
            assert writer.put(keys, blocks) == [True] * 32
        with chain_of(registry, peer_tier(b)) as only_b:
            on_b = [w == 0 for w in only_b.lookup(keys)]
        chain = chain_of(registry, peer_tier(a, b, request_timeout="3s"))
        a.signal(signal.SIGSTOP)
        try:
            got = read(chain, keys, [1000] * 32)
            # b's keys come back, a's are misses, and the tier stays in service
            assert got == [blk if mine else None for blk, mine in zip(blocks, on_b)]
            tier = chain.stats()["tiers"][0]
            assert tier["healthy"] and tier["backend_stats"]["timeouts"] >= 1
        finally:
            a.signal(signal.SIGCONT)
        wait_for(lambda: read(chain, keys, [1000] * 32) == blocks, "the thawed peer")
        chain.close()


class FakePeer:
    """Handshakes, then answers every GET with half its payload and ``then`` ("hang"/"close")."""

    def __init__(self, then: str) -> None:
        self.then = then
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.release = threading.Event()
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(sock,), daemon=True).start()

    def serve(self, sock: socket.socket) -> None:
        with sock:
            pp.tune(sock)
            reader = pp.FrameReader()
            deadline = time.monotonic() + 60
            try:
                pp.server_handshake(sock, reader, None, 1 << 30, deadline)
                while True:
                    request = pp.parse_message(*reader.read_head(sock, deadline, 1 << 30))
                    assert isinstance(request, pp.Request)
                    if request.kind != pp.GET:
                        body = {"t": pp.REPLY, "id": request.rid, "r": [True] * len(request.keys)}
                        pp.send_buffers(sock, [pp.frame(body)], deadline)
                        continue
                    sizes = [1 << 20] * len(request.keys)
                    head = pp.frame({"t": pp.REPLY, "id": request.rid, "s": sizes}, sum(sizes))
                    pp.send_buffers(sock, [head, bytes(sum(sizes) // 2)], deadline)
                    if self.then == "close":
                        return
                    self.release.wait(60)
                    return
            except (OSError, ProtocolError):
                return

    def close(self) -> None:
        self.release.set()
        self.listener.close()


@pytest.mark.parametrize("then", ["hang", "close"])
def test_a_peer_failing_mid_reply_gives_misses(registry: BackendRegistry, then: str) -> None:
    fake = FakePeer(then)
    try:
        with chain_of(registry, peer_tier(fake.address, request_timeout="1s")) as chain:
            keys = [key(i) for i in range(4)]
            assert read(chain, keys, [1000] * 4) == [None] * 4
            stats = chain.stats()["tiers"][0]
            assert stats["errors"] == 1 and not stats["healthy"]
            if then == "hang":
                assert stats["backend_stats"]["timeouts"] >= 1
    finally:
        fake.close()


def test_a_peer_down_at_open_is_retried(
    tmp_path: Path, registry: BackendRegistry, fast_recovery: None
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # free once closed
    address = f"127.0.0.1:{port}"
    with chain_of(registry, peer_tier(address, connect_timeout="1s")) as chain:
        assert chain.put([key(1)], [b"a" * 100]) == [False]
        assert chain.stats()["tiers"][0]["backend_stats"][f"peer.{address}.up"] == 0
        with PeerServer(tmp_path / "late", listen=address):
            wait_for(lambda: chain.put([key(1)], [b"a" * 100]) == [True], "the late peer")
            assert read(chain, [key(1)], [100]) == [b"a" * 100]


def test_idle_namespaces_are_closed_beyond_the_limit(
    tmp_path: Path, registry: BackendRegistry
) -> None:
    spaces = [Namespace(f"model-{i}") for i in range(3)]
    with PeerServer(tmp_path / "lru", args=("--max-namespaces", "1")) as srv:
        for i, ns in enumerate(spaces):
            with chain_of(registry, peer_tier(srv), namespace=ns) as chain:
                assert chain.put([key(i)], [block(i, 777)]) == [True]
        for i, ns in enumerate(spaces):  # reopened from the disk tier (written through)
            with chain_of(registry, peer_tier(srv), namespace=ns) as chain:
                assert read(chain, [key(i)], [777]) == [block(i, 777)]
                (stats,) = backend_of(chain).server_stats().values()
                assert stats is not None and list(stats["namespaces"]) == [ns.hex]


def test_connections_beyond_the_limit_are_refused_and_stats_are_logged(
    tmp_path: Path, registry: BackendRegistry
) -> None:
    args = ("--max-connections", "1", "--stats-interval", "0.1")
    with PeerServer(tmp_path / "busy", args=args) as srv, \
            chain_of(registry, peer_tier(srv, connections=1)) as first:
        assert first.put([key(1)], [b"x" * 64]) == [True]
        with chain_of(registry, peer_tier(srv, connections=1)) as second:  # opens: busy is
            assert second.put([key(2)], [b"y" * 64]) == [False]  # an outage, not an error
        assert read(first, [key(1)], [64]) == [b"x" * 64]
        wait_for(lambda: "1 connections, 1 namespaces" in srv.log(), "a stats line")
        assert "refused: 1 connections open" in srv.log()


# --- options and lifecycle -------------------------------------------------------------------


@pytest.mark.parametrize(("peers", "reason"), [
    ([], "non-empty"),
    (["nohostport"], "HOST:PORT"),
    (["a:1", "a:1"], "more than once"),
])
def test_bad_peer_options_are_config_errors(
    registry: BackendRegistry, peers: list[str], reason: str
) -> None:
    with pytest.raises(ConfigError, match=reason):
        chain_of(registry, {"name": "p", "backend": "peer", "peers": peers})


def test_capabilities_and_use_after_close(server: PeerServer, registry: BackendRegistry) -> None:
    chain = chain_of(registry, peer_tier(server))
    caps = chain.tiers[0].capabilities
    assert (caps.persistent, caps.shared, caps.thread_safe, caps.reports_evictions) == (
        False, True, True, False)
    backend = backend_of(chain)
    chain.close()
    backend.kvtier_close()  # idempotent
    with pytest.raises(ClosedError):
        backend.kvtier_lookup([key(1)])
