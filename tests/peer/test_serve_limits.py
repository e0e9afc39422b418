"""`kvtier serve` against clients that hold on to it: a stopped client during SIGTERM (the
drain deadline, ``--grace``) and idle sockets that never authenticate (their own budget and
``--handshake-timeout``)."""

from __future__ import annotations

import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from peer_chain import NS, backend_of, block, chain_of, key, peer_tier, read
from peer_server import PeerServer, node_config, run_serve

from kvtier.block.framing import Codec, encode
from kvtier.peer import protocol as pp
from kvtier.peer.server import serve_command
from kvtier.plugins.registry import BackendRegistry

SECRET = "correct horse battery staple"
BLOCKS, SIZE = 24, 2 << 20  # a 48 MiB GET reply: far more than both sockets' buffers hold

#: Asks for every block in one GET, takes the first MiB of the reply, says so, and once
#: resumed reads to the end of the stream.
CLIENT = """
import socket, sys, time
from kvtier.peer import protocol as pp
port, ns, keys = int(sys.argv[1]), sys.argv[2], [bytes.fromhex(k) for k in sys.argv[3:]]
sock = socket.create_connection(("127.0.0.1", port), timeout=30)
pp.tune(sock)
deadline = time.monotonic() + 600
pp.client_handshake(sock, namespace=ns, secret=None, max_payload=1 << 30, label="server",
                    deadline=deadline)
pp.send_buffers(sock, [pp.frame({"t": pp.GET, "id": 1, "k": keys})], deadline)
reply = pp.parse_message(*pp.FrameReader().read_head(sock, deadline, 1 << 30))
total = sum(reply.sizes)
got = 0
sock.setblocking(True)
while got < 1 << 20:
    got += len(sock.recv(1 << 20))
print("receiving", sock.getsockname()[1], flush=True)
try:
    while chunk := sock.recv(1 << 20):
        got += len(chunk)
except ConnectionResetError:
    pass
print("received", got, "of", total, flush=True)
"""


def put_blocks(server: PeerServer) -> list[bytes]:
    """Store BLOCKS framed blocks over a raw connection; their keys."""
    keys = [key(i) for i in range(BLOCKS)]
    blobs = [encode(NS.fingerprint, k, block(i, SIZE), Codec()) for i, k in enumerate(keys)]
    sizes = [memoryview(b).nbytes for b in blobs]
    deadline = time.monotonic() + 120
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        pp.tune(sock)
        pp.client_handshake(sock, namespace=NS.hex, secret=None, max_payload=1 << 30,
                            label=server.address, deadline=deadline)
        head = pp.frame({"t": pp.PUT, "id": 1, "k": keys, "s": sizes}, sum(sizes))
        pp.send_buffers(sock, [head, *blobs], deadline)
        reply = pp.parse_message(*pp.FrameReader().read_head(sock, deadline, 0))
    assert reply == pp.Reply(1, None, [True] * BLOCKS)
    return keys


def test_sigterm_closes_a_stopped_client_after_the_grace(tmp_path: Path) -> None:
    root = tmp_path / "node"
    server = PeerServer(root, config=node_config(root, disk=False),
                        args=("--grace", "1s")).start()
    client: subprocess.Popen[str] | None = None
    try:
        keys = put_blocks(server)
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(server.port), NS.hex, *(k.hex() for k in keys)],
            stdout=subprocess.PIPE, text=True)
        assert client.stdout is not None
        words = client.stdout.readline().split()
        assert words[0] == "receiving", words
        client.send_signal(signal.SIGSTOP)  # stalled mid-reply: the server's send waits
        server.signal(signal.SIGTERM)
        assert server.proc is not None
        # The grace is 1 s; before it, a stalled send kept the server for its 60 s frame
        # deadline.  The bound is generous (a slow machine) and well below that.
        code = server.proc.wait(25)
        log = server.log()
        assert code == 0, log
        assert (f"1 connections still busy 1s after the stop (--grace), closing them: "
                f"127.0.0.1:{words[1]}") in log
        client.send_signal(signal.SIGCONT)
        out, _ = client.communicate(timeout=60)
        got, total = int(out.split()[1]), int(out.split()[3])
        assert total == BLOCKS * len(encode(NS.fingerprint, keys[0], block(0, SIZE), Codec()))
        assert got < total  # the reply was cut off, not finished
    finally:
        if client is not None and client.poll() is None:
            client.send_signal(signal.SIGCONT)
            client.kill()
            client.wait(60)
        server.kill()


def closed(sock: socket.socket, timeout: float) -> bool:
    """True once the server has closed ``sock`` (end of stream or reset) within ``timeout``."""
    if not select.select([sock], [], [], timeout)[0]:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_idle_sockets_leave_room_for_a_client_with_the_secret(
    tmp_path: Path, registry: BackendRegistry
) -> None:
    # the deadline is long enough that the idle sockets surely still wait when the client
    # comes, so only their own budget can make room for it
    args = ("--handshake-timeout", "8s")
    with PeerServer(tmp_path / "s", secret=SECRET, args=args) as srv:
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=30)
                for _ in range(300)]  # more than the 256 connections allowed
        try:
            keys = [key(i) for i in range(4)]
            blocks = [block(i, 1000 * (i + 1)) for i in range(4)]
            with chain_of(registry, peer_tier(srv, secret=SECRET)) as chain:
                assert chain.put(keys, blocks) == [True] * 4
                assert read(chain, keys, [len(b) for b in blocks]) == blocks
                # every idle socket is closed: the oldest to admit newer ones, the rest at
                # their handshake deadline (8 s; the wait is generous, a slow machine)
                assert [i for i, sock in enumerate(idle) if not closed(sock, 60)] == []
                (stats,) = backend_of(chain).server_stats().values()
            assert stats is not None
            server = stats["server"]
            assert server["handshakes_evicted"] + server["handshake_timeouts"] == 300
            assert server["handshake_timeouts"] >= 1 and server["refused"] == 0
        finally:
            for sock in idle:
                sock.close()
    assert "no handshake within 8s" in srv.log()


def test_bad_limits_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "node.yaml"
    config.write_text("chain:\n  - {name: ram, backend: host, capacity: 1MiB}\n")
    base = ["--config", str(config), "--listen", "127.0.0.1:0"]
    for option, value, message in (("--grace", "soon", "--grace: expected a duration"),
                                   ("--handshake-timeout", "0s",
                                    "--handshake-timeout must be above 0"),
                                   ("--grace", "inf", "--grace: expected a duration"),
                                   ("--stats-interval", "nan",
                                    "--stats-interval: expected a finite number, got nan"),
                                   ("--stats-interval", "inf",
                                    "--stats-interval: expected a finite number, got inf")):
        done = run_serve([*base, option, value])
        assert done.returncode == 2 and message in done.stderr, done.stderr


def test_the_readme_gives_every_limit_of_serve_with_its_default() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(--[\w-]+)` \| `([^`|]+)` \| [^|]+ \|$", readme, flags=re.M))
    options = {f"--{p.name.replace('_', '-')}": p.default for p in serve_command.params}
    assert rows and {name: options.get(name) for name in rows} == {
        name: int(value) if value.isdigit() else value for name, value in rows.items()}
    assert f"`--grace` (default `{options['--grace']}`)" in readme
