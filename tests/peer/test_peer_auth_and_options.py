"""What the peer tier refuses: wrong or missing secrets, another protocol version, bad options,
use after close; and the capabilities it declares."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from peer_chain import NS, backend_of, block, chain_of, key, peer_tier, read
from peer_server import PeerServer, run_serve

from kvtier.peer import protocol as pp
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import BackendError, ClosedError, ConfigError, ConnectionClosedError

SECRET = "correct horse battery staple"


# --- authentication and refusals -------------------------------------------------------------


def test_secret_right_one_works_wrong_or_none_refused(
    tmp_path: Path, registry: BackendRegistry
) -> None:
    with PeerServer(tmp_path / "s", secret=SECRET) as srv, \
            chain_of(registry, peer_tier(srv, secret=SECRET)) as good:
        assert good.put([key(1)], [block(1, 500)]) == [True]
        # required: the refusal fails the open (by default the tier starts failed)
        with pytest.raises(BackendError, match=r"authentication failed") as wrong:
            chain_of(registry, peer_tier(srv, secret="not the secret", required=True))
        with pytest.raises(BackendError, match=r"requires authentication") as none:
            chain_of(registry, peer_tier(srv, required=True))
        with chain_of(registry, peer_tier(srv, secret="not the secret")) as started:
            (tier,) = started.stats()["tiers"]
            assert not tier["healthy"] and "authentication failed" in tier["last_error"]
            assert read(started, [key(1)], [500]) == [None]  # a miss, not an error
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
        chain_of(registry, peer_tier(server, secret=SECRET, required=True))


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
        chain_of(registry, peer_tier(server, required=True))
    assert server.address in str(exc.value)


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
