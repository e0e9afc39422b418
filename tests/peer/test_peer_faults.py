"""The peer tier through shutdowns, faults and recovery: SIGTERM mid-request, killed, frozen
and restarted servers, peers failing mid-reply or down at open, and the server's limits."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from peer_chain import NS, backend_of, block, chain_of, key, peer_tier, read
from peer_server import PeerServer

import kvtier.backends.peer.wire as peer_wire
import kvtier.chain.health as tier_module
from kvtier import Namespace
from kvtier.block.framing import Codec, encode
from kvtier.peer import protocol as pp
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import ProtocolError


def wait_for(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def fast_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short back-offs, so tests that wait for a peer to come back wait little."""
    monkeypatch.setattr(tier_module, "_BACKOFF_FIRST", 0.05)
    monkeypatch.setattr(tier_module, "_BACKOFF_MAX", 0.5)
    monkeypatch.setattr(peer_wire, "BACKOFF_MAX", 0.5)


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
