"""``kvtier serve``: serve the blocks of this node's chain to other nodes.

Another node's chain reaches this one through a tier with ``backend: peer``
(:mod:`kvtier.backends.peer`).  Blocks travel framed exactly as the client's
chain framed them (namespace fingerprint, key, checksum), and this server
stores and returns them opaquely through :meth:`Chain.put_blobs` and
:meth:`Chain.get_blobs`.  A put's headers are checked on arrival; payload
checksums are checked where blocks are read: by this server's tiers when they
read them, and by the client on every block it receives.  So a faulty server
or network (bit rot, a bug, another namespace or key) can lose blocks but not
hand over wrong KV undetected.  The xxh3 checksum is no MAC, though: a *malicious*
server, or anyone able to tamper with the unencrypted traffic, could forge a
block that passes, so peers must be trusted machines on a trusted network.

One chain per namespace is opened lazily from the one configuration file
(the client names its namespace in the handshake); at most
``--max-namespaces`` stay open, the least recently used idle one is closed
beyond that.  Note that each namespace's chain has its own tiers, so a
``host`` capacity applies per namespace, and closing a chain drops what
only its RAM tier held: give served chains ``write: through`` below RAM.

The data path uses threads and plain non-blocking sockets polled with a
deadline, receiving each block of a put with one ``recv`` into the object
the store keeps (:func:`~kvtier.peer.protocol.recv_blocks`) and sending with
``sendmsg`` gather lists, which on loopback reach several times what asyncio
streams did (BENCHMARKS.md, "Figures behind design choices").  One thread serves one
connection, so a connection's replies come in request order.

Listening beyond loopback requires a shared secret (``--secret-file`` or
``KVTIER_PEER_SECRET``, never a command-line value); with a secret, every
connection must pass a mutual HMAC-SHA256 challenge-response before it may
send requests or open a namespace.  The secret authenticates the peers; it
does not encrypt or sign the traffic (use a private network, WireGuard or an
SSH tunnel across untrusted networks).  Connections not yet through the
handshake have a deadline and a budget of their own (:mod:`kvtier.peer._limits`).
After SIGTERM, requests already sent are answered for ``--grace``; then
connections still busy (a stalled client) are closed, and the process exits.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import os
import select
import signal
import socket
import stat
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import click
import msgpack

from kvtier.block.namespace import Namespace
from kvtier.chain.chain import Chain
from kvtier.config.chain_config import ChainConfig, load_config
from kvtier.config.units import format_size, parse_duration, parse_size
from kvtier.peer import answers
from kvtier.peer import protocol as pp
from kvtier.peer._limits import Connection, Connections, PayloadBudget
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import (
    BytesLike,
    ConfigError,
    ConnectionClosedError,
    KvtierError,
    ProtocolError,
    RefusedError,
)

__all__ = ["SECRET_ENV", "PeerServer", "is_loopback", "parse_listen", "serve_command"]

log = logging.getLogger("kvtier.peer.server")

SECRET_ENV = "KVTIER_PEER_SECRET"
DEFAULT_LISTEN = "127.0.0.1:7077"
#: A client must finish the handshake within this (``--handshake-timeout``).
HANDSHAKE_TIMEOUT = 5.0
#: Connections not yet authenticated, at most (``--max-unauthenticated``).
MAX_UNAUTHENTICATED = 64
#: A client waits this long at most for a namespace to be opened (or to go idle).
NAMESPACE_WAIT = 10.0
#: Once a frame starts arriving it must be complete within this (slow-loris bound).
FRAME_TIMEOUT = 60.0
#: How often idle connections and the accept loop look at the stop flag.
IDLE_POLL = 0.25
#: After SIGTERM, requests already on the wire are still answered for this long;
#: then the connections still busy are closed (``--grace``).  Below Kubernetes'
#: default grace period of 30 s, which also has to cover closing the chains.
DRAIN_GRACE = 10.0
#: After the grace, how long closed connections' threads are waited for.
CLOSE_WAIT = 5.0
#: Bytes of PUT payloads all connections together may be receiving at once.
PAYLOAD_MEMORY = 1 << 30


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> ``(host, port)``."""
    try:
        return pp.parse_address(text)
    except ValueError as exc:
        raise ConfigError(f"--listen: {exc}") from None


def is_loopback(host: str) -> bool:
    """True if every address ``host`` names is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    addresses = {str(info[4][0]).split("%")[0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def read_secret(secret_file: str | None, environ: Mapping[str, str]) -> bytes | None:
    """The shared secret from a file or the environment; None when neither is set."""
    if secret_file is not None:
        mode = os.stat(secret_file).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("kvtier serve: secret file %s is accessible to group or others; "
                        "chmod 600 it", secret_file)
        with open(secret_file, "rb") as f:
            secret = f.read().strip()
        if not secret:
            raise ConfigError(f"secret file {secret_file} is empty")
        return secret
    value = environ.get(SECRET_ENV, "").strip()
    return value.encode() if value else None


def _readable(sock: socket.socket, timeout: float) -> bool:
    if not hasattr(select, "poll"):  # pragma: no cover - Windows
        return bool(select.select([sock], [], [], timeout)[0])
    poller = select.poll()  # poll, not select: descriptors may exceed FD_SETSIZE
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(int(timeout * 1000)))


class _Entry:
    __slots__ = ("chain", "lock", "refs")

    def __init__(self) -> None:
        self.chain: Chain | None = None
        self.refs = 0
        self.lock = threading.Lock()


class _Namespaces:
    """Chains by namespace hex: opened on first use, LRU-closed beyond ``limit`` when idle."""

    def __init__(self, config: ChainConfig, registry: BackendRegistry | None, limit: int) -> None:
        self._config = config
        self._registry = registry
        self._limit = limit
        self._cond = threading.Condition()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def acquire(self, ns: str, deadline: float) -> tuple[_Entry, Chain]:
        victims: list[_Entry] = []
        with self._cond:
            while (entry := self._entries.get(ns)) is None:
                if len(self._entries) < self._limit:
                    entry = self._entries[ns] = _Entry()
                    break
                idle = next((h for h, e in self._entries.items() if not e.refs), None)
                if idle is not None:
                    victims.append(self._entries.pop(idle))
                # every open namespace is in use: wait a little for one to go idle
                elif not self._cond.wait(deadline - time.monotonic()):
                    raise KvtierError(f"all {self._limit} namespaces are in use")
            entry.refs += 1
            self._entries.move_to_end(ns)
        for victim in victims:  # nobody holds them (refs == 0), close outside the lock
            if victim.chain is not None:
                log.info("kvtier serve: closing idle namespace %s", victim.chain.namespace.hex)
                victim.chain.close()
        try:
            with entry.lock:  # one opener per namespace; others wait for its chain
                if entry.chain is None:
                    entry.chain = Chain(self._config, Namespace.from_hex(ns), self._registry)
                    log.info("kvtier serve: opened namespace %s", ns)
                return entry, entry.chain
        except BaseException:
            self.release(ns, entry)
            raise

    def release(self, ns: str, entry: _Entry) -> None:
        with self._cond:
            entry.refs -= 1
            if entry.chain is None and not entry.refs and self._entries.get(ns) is entry:
                del self._entries[ns]  # a failed open leaves nothing behind
            self._cond.notify_all()

    def chains(self) -> list[Chain]:
        with self._cond:
            return [e.chain for e in self._entries.values() if e.chain is not None]

    def close_all(self) -> None:
        with self._cond:
            entries = list(self._entries.values())
            self._entries.clear()
        for entry in entries:
            if entry.chain is not None:
                try:
                    entry.chain.close()
                except Exception:
                    log.exception("kvtier serve: closing namespace %s failed",
                                  entry.chain.namespace.hex)


class PeerServer:
    """Serves one chain configuration, per namespace, over the peer protocol."""

    def __init__(
        self,
        config: ChainConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 7077,
        secret: bytes | None = None,
        max_payload: int = pp.DEFAULT_MAX_PAYLOAD,
        max_connections: int = 256,
        max_unauthenticated: int = MAX_UNAUTHENTICATED,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        grace: float = DRAIN_GRACE,
        max_namespaces: int = 64,
        registry: BackendRegistry | None = None,
    ) -> None:
        self.host, self.port = host, port
        self._secret = secret
        self._max_payload = max_payload
        self._handshake_timeout = handshake_timeout
        self._grace = grace
        self._conns = Connections(max_connections, max_unauthenticated)
        self._namespaces = _Namespaces(config, registry, max_namespaces)
        self._budget = PayloadBudget(max(PAYLOAD_MEMORY, max_payload))
        self._stopping = threading.Event()
        self._stop_time = 0.0
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(
            ("connections", "requests", "bytes_in", "bytes_out", "protocol_errors",
             "auth_failures", "refused", "handshake_timeouts", "handshakes_evicted",
             "closed_at_grace", "errors"), 0)
        self._by_kind: dict[str, int] = {}
        self._started = time.monotonic()

    # lifecycle ----------------------------------------------------------------
    def start(self) -> str:
        """Bind and listen; returns ``HOST:PORT`` (the real port when 0 was asked)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.create_server((self.host, self.port), family=family, backlog=128)
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        return pp.format_address(self.host, self.port)

    def stop(self) -> None:
        """Stop accepting; connections finish what is in flight.  Safe in a signal handler."""
        if not self._stopping.is_set():
            self._stop_time = time.monotonic()
            self._stopping.set()

    def serve(self, stats_interval: float = 0.0) -> None:
        """Accept connections until :meth:`stop`; log a summary every ``stats_interval`` s."""
        listener = self._listener
        if listener is None:
            raise RuntimeError("call start() first")
        next_stats = time.monotonic() + stats_interval
        while not self._stopping.is_set():
            if stats_interval > 0 and time.monotonic() >= next_stats:
                log.info("%s", self.summary())
                next_stats = time.monotonic() + stats_interval
            try:
                if not _readable(listener, IDLE_POLL):
                    continue
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:  # out of descriptors, ...: keep serving the others
                log.error("kvtier serve: accept failed: %s", exc)
                time.sleep(IDLE_POLL)
                continue
            self._admit(sock, pp.format_address(str(addr[0]), int(addr[1])))

    def close(self) -> None:
        """After :meth:`serve`: let connections finish for the grace, then close them
        and every chain."""
        self.stop()
        if self._listener is not None:
            self._listener.close()
        self._conns.shut(pending_only=True)  # no request of theirs can be in flight
        if not self._conns.join(self._stop_time + self._grace):
            stalled = self._conns.shut()
            self._budget.close()
            self._count(closed_at_grace=len(stalled))
            log.warning("kvtier serve: %d connections still busy %gs after the stop "
                        "(--grace), closing them: %s", len(stalled), self._grace,
                        ", ".join(stalled))
            if not self._conns.join(time.monotonic() + CLOSE_WAIT):
                log.error("kvtier serve: connections still running after they were "
                          "closed; closing the chains beside them")
        self._namespaces.close_all()

    def _admit(self, sock: socket.socket, label: str) -> None:
        pp.tune(sock)
        conn, evicted = self._conns.admit(sock, label, self._connection)
        if evicted is not None:
            self._count(handshakes_evicted=1)
            log.warning("kvtier serve: %s closed before its handshake to admit %s: "
                        "%d connections await theirs", evicted.label, label,
                        self._conns.unauthenticated)
        if conn is None:
            self._count(refused=1)
            log.warning("kvtier serve: %s refused: %d connections open", label,
                        self._conns.limit)
            with contextlib.suppress(OSError):  # best effort: the client learns why
                sock.send(pp.error_frame(0, "busy", "server has too many connections"))
            sock.close()
            return
        self._count(connections=1)
        assert conn.thread is not None
        conn.thread.start()

    # figures --------------------------------------------------------------------
    def _count(self, kind: str | None = None, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                self._counts[name] += n
            if kind is not None:
                self._by_kind[kind] = self._by_kind.get(kind, 0) + 1

    def stats(self) -> dict[str, Any]:
        """Server counters and every open namespace's chain stats."""
        with self._lock:
            server: dict[str, Any] = dict(self._counts)
            server["by_kind"] = dict(self._by_kind)
        server["open_connections"] = len(self._conns)
        server["uptime_s"] = round(time.monotonic() - self._started, 3)
        chains = self._namespaces.chains()
        server["namespaces"] = len(chains)
        return {"server": server, "namespaces": {c.namespace.hex: c.stats() for c in chains}}

    def summary(self) -> str:
        s = self.stats()["server"]
        return (f"kvtier serve: {s['open_connections']} connections, {s['namespaces']} "
                f"namespaces, {s['requests']} requests, in {format_size(s['bytes_in'])}, "
                f"out {format_size(s['bytes_out'])}, {s['protocol_errors']} protocol errors, "
                f"{s['auth_failures']} auth failures")

    # one connection ---------------------------------------------------------------
    def _connection(self, conn: Connection) -> None:
        sock, label = conn.sock, conn.label
        held: tuple[str, _Entry] | None = None
        try:
            reader = pp.FrameReader()
            try:
                hello = pp.server_handshake(sock, reader, self._secret, self._max_payload,
                                            conn.accepted + self._handshake_timeout)
            except RefusedError as exc:
                self._count(auth_failures=int(exc.auth))
                log.warning("kvtier serve: %s: refused: %s", label, exc)
                return
            except TimeoutError:
                self._count(handshake_timeouts=1)
                log.warning("kvtier serve: %s: no handshake within %gs, closing the "
                            "connection", label, self._handshake_timeout)
                return
            self._conns.authenticated(conn)
            try:
                entry, chain = self._namespaces.acquire(
                    hello.namespace, time.monotonic() + NAMESPACE_WAIT)
            except Exception as exc:
                log.error("kvtier serve: %s: cannot open namespace %s: %s", label,
                          hello.namespace, exc)
                self._count(errors=1)
                pp.send_buffers(sock, [pp.error_frame(0, "unavailable", str(exc))],
                                time.monotonic() + NAMESPACE_WAIT)
                return
            held = (hello.namespace, entry)
            self._requests(sock, label, reader, chain, min(self._max_payload, hello.max_payload))
        except ProtocolError as exc:
            self._count(protocol_errors=1)
            log.warning("kvtier serve: %s: protocol error, closing the connection: %s", label, exc)
        except ConnectionClosedError as exc:
            if exc.received:
                log.warning("kvtier serve: %s: %s", label, exc)
            else:
                log.debug("kvtier serve: %s: closed", label)
        except TimeoutError:
            log.warning("kvtier serve: %s: timed out, closing the connection", label)
        except OSError as exc:
            log.info("kvtier serve: %s: connection failed: %s", label, exc)
        except Exception:  # a bug must cost one connection, never the server
            self._count(errors=1)
            log.exception("kvtier serve: %s: unexpected error", label)
        finally:
            if held is not None:
                self._namespaces.release(*held)
            self._conns.leave(conn)

    def _await_request(self, sock: socket.socket) -> bool:
        """Wait for the next request; False when stopping and nothing is on the wire."""
        while True:
            if self._stopping.is_set():
                # answer what clients already sent, so a stop never cuts a request off
                in_grace = time.monotonic() < self._stop_time + self._grace
                return in_grace and _readable(sock, 0)
            if _readable(sock, IDLE_POLL):
                return True

    def _requests(
        self, sock: socket.socket, label: str, reader: pp.FrameReader, chain: Chain, limit: int
    ) -> None:
        while self._await_request(sock):
            deadline = time.monotonic() + FRAME_TIMEOUT
            head, payload_len = reader.read_head(sock, deadline, self._max_payload)
            request = pp.parse_message(head, payload_len)
            if not isinstance(request, pp.Request):
                raise ProtocolError(f"expected a request, got {type(request).__name__}")
            kind = pp.NAMES[request.kind]
            blobs: list[BytesLike] = []
            if payload_len:  # only a PUT has one
                self._budget.take(payload_len, deadline)
            try:
                if payload_len:
                    blobs.extend(pp.recv_blocks(sock, request.sizes, deadline))
                try:
                    parts = self._answer(request, chain, blobs, limit)
                except Exception as exc:  # chains turn backend faults into misses: a bug
                    log.exception("kvtier serve: %s: %s failed", label, kind)
                    self._count(errors=1)
                    parts = [pp.error_frame(request.rid, "internal", f"{kind} failed: {exc!r}")]
            finally:
                blobs.clear()  # what the chain keeps, it holds itself
                if payload_len:
                    self._budget.give(payload_len)
            sent = pp.send_buffers(sock, parts, time.monotonic() + FRAME_TIMEOUT)
            self._count(kind, requests=1, bytes_in=payload_len, bytes_out=sent)

    def _answer(
        self, request: pp.Request, chain: Chain, blobs: list[BytesLike], limit: int
    ) -> list[BytesLike]:
        """The reply to one request, as a gather list (frame head, then blobs)."""
        keys, rid = request.keys, request.rid
        if request.kind == pp.GET:
            return answers.get(rid, chain, keys, limit)
        # the optional requests reach this connection's namespace only
        if request.kind == pp.DEADLINES:
            return [pp.frame({"t": pp.REPLY, "id": rid, "l": answers.deadlines(chain, keys)})]
        if request.kind in pp.OPTIONAL:
            marks = (answers.expire(chain, keys, request.after) if request.kind == pp.EXPIRE
                     else answers.keep(chain, keys, request.kind == pp.KEEP))
            return [pp.frame({"t": pp.REPLY, "id": rid, "o": marks})]
        if request.kind == pp.PUT:
            flags = chain.put_blobs(keys, blobs, verify=False)  # checked where read
        elif request.kind == pp.LOOKUP:
            flags = [where is not None for where in chain.lookup(keys)]
        elif request.kind == pp.EVICT:
            flags = answers.evict(chain, keys)
        else:  # STATS
            payload: bytes = msgpack.packb(self.stats(), use_bin_type=True, default=str)
            return [pp.frame({"t": pp.REPLY, "id": rid}, len(payload)), payload]
        return [pp.frame({"t": pp.REPLY, "id": rid, "r": [bool(f) for f in flags]})]


def _seconds(name: str, text: str, *, positive: bool = False) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    if positive and not seconds:
        raise ConfigError(f"{name} must be above 0, got {text}")
    return seconds


@click.command("serve")
@click.option("--config", "config_path", required=True,
              type=click.Path(exists=True, dir_okay=False), help="Chain configuration (YAML).")
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True,
              help="HOST:PORT to listen on; port 0 picks a free one.")
@click.option("--secret-file", type=click.Path(exists=True, dir_okay=False),
              help=f"File holding the shared secret (else ${SECRET_ENV}); "
                   "required beyond loopback.")
@click.option("--stats-interval", type=click.FloatRange(min=0), default=60.0,
              show_default=True, help="Seconds between summary log lines; 0 turns them off.")
@click.option("--max-payload", default="256MiB", show_default=True,
              help="Largest frame payload accepted or sent.")
@click.option("--max-connections", type=click.IntRange(1, 65536), default=256,
              show_default=True)
@click.option("--max-unauthenticated", type=click.IntRange(1, 65536),
              default=MAX_UNAUTHENTICATED, show_default=True,
              help="Connections still in their handshake, at most (and at most "
                   "--max-connections); the oldest is closed to admit another.")
@click.option("--handshake-timeout", default=f"{HANDSHAKE_TIMEOUT:g}s", show_default=True,
              help="A connection that has not finished its handshake within this is closed.")
@click.option("--grace", default=f"{DRAIN_GRACE:g}s", show_default=True,
              help="After SIGTERM, requests in flight get this long; then connections "
                   "still busy (a stalled client) are closed and the server exits.")
@click.option("--max-namespaces", type=click.IntRange(1, 65536), default=64,
              show_default=True, help="Chains kept open; idle ones beyond are closed.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def serve_command(
    config_path: str,
    listen: str,
    secret_file: str | None,
    stats_interval: float,
    max_payload: str,
    max_connections: int,
    max_unauthenticated: int,
    handshake_timeout: str,
    grace: str,
    max_namespaces: int,
    log_level: str,
) -> None:
    """Serve this node's chain to other nodes' `peer` tiers until SIGTERM or SIGINT."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        host, port = parse_listen(listen)
        secret = read_secret(secret_file, os.environ)
        if secret is None and not is_loopback(host):
            raise ConfigError(
                f"refusing to listen on {listen} without authentication: anyone who can "
                f"reach it could read and write this node's KV cache; give a shared secret "
                f"with --secret-file PATH or the {SECRET_ENV} environment variable "
                "(only loopback addresses may go without)")
        if not math.isfinite(stats_interval):  # NaN passes FloatRange and turns them off
            raise ConfigError(f"--stats-interval: expected a finite number, got {stats_interval}")
        limit = parse_size(max_payload)
        if not 1 << 16 <= limit <= pp.MAX_U32:
            raise ConfigError(f"--max-payload must be 64KiB to 4GiB-1, got {max_payload}")
        server = PeerServer(load_config(config_path), host=host, port=port, secret=secret,
                            max_payload=limit, max_connections=max_connections,
                            max_unauthenticated=max_unauthenticated,
                            handshake_timeout=_seconds("--handshake-timeout",
                                                       handshake_timeout, positive=True),
                            grace=_seconds("--grace", grace),
                            max_namespaces=max_namespaces)
        address = server.start()
    except (KvtierError, OSError, ValueError) as exc:
        click.echo(f"kvtier serve: error: {exc}", err=True)
        sys.exit(2)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.stop())
    auth = "HMAC authentication" if secret is not None else "no authentication (loopback)"
    log.info("kvtier serve: %s, config %s", auth, config_path)
    click.echo(f"kvtier serve: listening on {address}")
    sys.stdout.flush()
    try:
        server.serve(stats_interval)
    finally:
        # Python puts default handlers back while it exits, so a second SIGTERM
        # during the drain could still kill us with a failure status: ignore it.
        # A second Ctrl-C does interrupt a drain that takes too long.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        server.close()
        log.info("%s; stopped", server.summary())
