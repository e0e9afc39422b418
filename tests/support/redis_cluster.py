"""A real Redis Cluster for tests: six ``redis-server`` processes, three masters and three replicas.

:class:`RedisClusterServer` starts six nodes in cluster mode on 127.0.0.1
(each a :class:`ClusterNode`, the process lifecycle of
:class:`server_process.ServerProcess`), every node announcing 127.0.0.1 and
its port, persistence off, and joins them with ``redis-cli --cluster create
... --cluster-replicas 1``: 16384 slots over three masters, one replica each.
It then waits until every node answers ``cluster_state:ok`` and agrees on the
slot map, so a client sees a settled cluster.

Ports are chosen free at or below 55535: a node's cluster bus listens on its
port + 10000, which must be free too.  ``cluster-node-timeout`` is short
(see :data:`NODE_TIMEOUT_MS`) so a killed master's replica is promoted within
seconds.  The same class runs Valkey (``binary`` = a ``valkey-server``),
which takes the same configuration and the same ``redis-cli`` commands.

:meth:`RedisClusterServer.tier` gives the chain tier dict of a ``redis``
tier with ``cluster: true`` on this cluster, for chain configs.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from redis_server import find_redis_server
from server_process import ServerProcess, StartedInWith

__all__ = [
    "NODE_TIMEOUT_MS", "ClusterNode", "RedisClusterServer", "find_redis_cli", "free_ports"
]

#: A master unreachable this long is marked failed and its replica takes
#: over; Redis' default is 15 s, far longer than a test wants to wait.
NODE_TIMEOUT_MS = 2000
_BUS_OFFSET = 10000
_HIGHEST_PORT = 65535 - _BUS_OFFSET


def find_redis_cli() -> str:
    """``redis-cli``, from Debian's redis-tools (installed with redis-server)."""
    found = shutil.which("redis-cli")
    if found is None:
        find_redis_server()  # installs redis-server and its redis-tools when root
        found = shutil.which("redis-cli")
    if found is None:
        raise FileNotFoundError("no redis-cli binary: install Debian's redis-tools")
    return found


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int, taken: set[int]) -> list[int]:
    """``count`` ports at or below 55535 whose port + 10000 is free too."""
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randint(20000, _HIGHEST_PORT)
        if port in taken or port + _BUS_OFFSET in taken:
            continue
        if _port_free(port) and _port_free(port + _BUS_OFFSET):
            ports.append(port)
            taken.update((port, port + _BUS_OFFSET))
    return ports


def _command(port: int, *args: str, timeout: float = 2.0) -> str:
    """One command in RESP over a plain socket; the reply's text (errors included)."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"".join(parts))
        reply = b""
        while True:
            chunk = s.recv(65536)
            reply += chunk
            if not chunk or _complete(reply):
                break
    return reply.decode(errors="replace")


def _complete(reply: bytes) -> bool:
    if reply[:1] in (b"+", b"-", b":"):
        return reply.endswith(b"\r\n")
    if reply[:1] in (b"$", b"="):  # bulk or verbatim string: length line, then the bytes
        head, _, rest = reply.partition(b"\r\n")
        return len(rest) >= int(head[1:]) + 2 if head[1:] != b"-1" else True
    return False


class ClusterNode(ServerProcess):
    """One ``redis-server --cluster-enabled yes`` on 127.0.0.1:``port``, files in ``base_dir``."""

    stop_timeout = 10.0
    log_lines = 30

    def __init__(self, binary: str, base_dir: Path, port: int) -> None:
        self.binary = binary
        self.port = port
        self.base_dir = base_dir
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = base_dir / "node.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.base_dir / "nodes.conf"),
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--cluster-announce-ip", "127.0.0.1",
            # a replica may take over however long its link was down: on a
            # loaded test machine a link can lag past the default's limit
            "--cluster-replica-validity-factor", "0",
            "--dir", str(self.base_dir),
            "--logfile", str(self.log_path),
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "no",
        ]

    def start(self) -> None:
        if self.running:
            return
        self._track(subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, cwd=self.base_dir, start_new_session=True,
        ))

    def ask(self, *args: str) -> str:
        """Send one command; its reply as text ('' if the node does not answer)."""
        try:
            return _command(self.port, *args)
        except OSError:
            return ""


class RedisClusterServer(StartedInWith):
    """Three masters and three replicas of ``binary`` (Debian's redis-server by default)."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        binary: str | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.binary = binary or find_redis_server()
        self.cli = find_redis_cli()
        self.startup_timeout = startup_timeout
        ports = free_ports(6, set())
        self.nodes = [ClusterNode(self.binary, self.base_dir / f"node-{p}", p) for p in ports]

    # lifecycle ------------------------------------------------------------
    def start(self) -> None:
        """Start the six nodes, create the cluster, wait until every node says ``ok``."""
        try:
            for node in self.nodes:
                node.start()
            self._wait(lambda: all("PONG" in n.ask("PING") for n in self.nodes), "answer PING")
            addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
            create = [self.cli, "--cluster", "create", *addresses,
                      "--cluster-replicas", "1", "--cluster-yes"]
            done = subprocess.run(create, capture_output=True, text=True, timeout=120, check=False)
            if done.returncode != 0:
                raise RuntimeError(
                    f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}"
                )
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    # what tests use -------------------------------------------------------
    @property
    def url(self) -> str:
        """A ``redis://`` URL naming one node (any node will do for a cluster client)."""
        node = next(n for n in self.nodes if n.running)
        return f"redis://127.0.0.1:{node.port}/0"

    def tier(self, name: str = "redis", **options: Any) -> dict[str, Any]:
        """A chain tier dict: backend ``redis`` with ``cluster: true`` on this cluster."""
        return {"name": name, "backend": "redis", "url": self.url, "cluster": True, **options}

    def masters(self) -> list[ClusterNode]:
        """Running nodes that are masters now, by their own ``INFO replication``."""
        return [
            n for n in self.nodes if n.running and "role:master" in n.ask("INFO", "replication")
        ]

    def node_at(self, port: int) -> ClusterNode:
        return next(n for n in self.nodes if n.port == port)

    def cluster_nodes(self) -> Iterator[list[str]]:
        """The fields of each line of ``CLUSTER NODES`` as a live node sees it."""
        node = next(n for n in self.nodes if n.running)
        text = node.ask("CLUSTER", "NODES")
        for line in text.splitlines()[1:]:
            if line.strip():
                yield line.split()

    def wait_ok(self, timeout: float | None = None) -> None:
        """Until every running node reports ``cluster_state:ok``, three masters own slots
        and every replica's link to its master is up (synced: it can take over)."""
        def settled() -> bool:
            live = [n for n in self.nodes if n.running]
            if not all("cluster_state:ok" in n.ask("CLUSTER", "INFO") for n in live):
                return False
            for node in live:
                info = node.ask("INFO", "replication")
                if "role:slave" in info and "master_link_status:up" not in info:
                    return False
            maps = {_slot_owners(n.ask("CLUSTER", "NODES")) for n in live}
            return len(maps) == 1 and len(next(iter(maps))) == 3

        self._wait(settled, "reach cluster_state:ok", timeout)

    def flush(self) -> None:
        """Empty every master (replicas follow)."""
        for node in self.masters():
            node.ask("FLUSHALL")

    def _wait(self, done: Any, what: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        while time.monotonic() < deadline:
            dead = [n for n in self.nodes if n._proc is not None and not n.running
                    and n._proc.returncode not in (-9, None)]
            if dead:
                raise RuntimeError(
                    f"cluster node {dead[0].port} exited; log:\n{dead[0].log_tail()}"
                )
            if done():
                return
            time.sleep(0.1)
        logs = "\n".join(f"--- node {n.port}\n{n.log_tail(10)}" for n in self.nodes)
        raise RuntimeError(f"the cluster did not {what} within the timeout\n{logs}")


def _slot_owners(nodes_text: str) -> frozenset[str]:
    """``host:port`` of each master owning slots in one ``CLUSTER NODES`` reply (not failed)."""
    owners = set()
    for line in nodes_text.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 8 and "master" in fields[2] and "fail" not in fields[2]:
            owners.add(fields[1].split("@")[0])
    return frozenset(owners)
