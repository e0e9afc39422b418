"""The ``peer`` backend's wire client: connections, replies, and each peer's pool.

A :class:`Conn` is one connection shared by threads: requests are written back
to back (pipelined) and, because the server answers a connection's requests in
order, the thread whose reply is next on the wire reads it itself, straight
into its destination (:class:`Payload`).  A :class:`Peer` holds a server's
connections and its back-off; :func:`chunks` splits a batch into requests
that fit the protocol's limits.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kvtier.peer import protocol as pp
from kvtier.spec import BytesLike, KvtierError, ProtocolError, RefusedError

__all__ = [
    "BACKOFF_FIRST",
    "BACKOFF_MAX",
    "HEADER_BUDGET",
    "Conn",
    "Payload",
    "Peer",
    "PeerDown",
    "chunks",
    "connect",
]

log = logging.getLogger("kvtier.backends.peer")

#: Seconds a failed peer is left alone: doubling from the first to the most.
BACKOFF_FIRST = 0.2
BACKOFF_MAX = 10.0
#: Header bytes a request may fill with keys and sizes (the rest is slack).
HEADER_BUDGET = pp.MAX_HEADER - 1024


class PeerDown(KvtierError, ConnectionError):
    """The peer cannot be reached now (or is in its back-off).  Never leaves the
    backend: a round turns it into that peer's failure, like any ``OSError``."""


class Payload:
    """The payload of one reply, read straight into wherever the caller says."""

    def __init__(self, sock: socket.socket, size: int, deadline: float) -> None:
        self.sock, self.remaining, self.deadline = sock, size, deadline

    def into(self, view: memoryview) -> None:
        if view.nbytes > self.remaining:
            raise ProtocolError("reply payload shorter than its sizes")
        pp.recv_exact(self.sock, view, self.deadline)
        self.remaining -= view.nbytes

    def read(self, size: int) -> bytearray:
        buffer = bytearray(size)
        self.into(memoryview(buffer))
        return buffer


class Conn:
    """One connection to a peer, shared by threads; replies come in request order."""

    def __init__(self, sock: socket.socket, label: str, max_payload: int,
                 extras: frozenset[int] = frozenset()) -> None:
        # the smaller of both sides' payload limits, agreed in the handshake
        self.sock, self.label, self.max_payload = sock, label, max_payload
        self.extras = extras  # the optional requests the server answers (pp.OPTIONAL)
        self.send_lock = threading.Lock()
        self.cond = threading.Condition()
        self.queue: deque[int] = deque()  # ids of requests on the wire, oldest first
        self.next_id = 1
        self.born = time.monotonic()
        self.broken: str | None = None
        self.reader = pp.FrameReader()  # used only by the thread whose turn it is

    def send(self, header: dict[str, Any], parts: Iterable[BytesLike], payload_len: int,
             deadline: float) -> tuple[int, bool, int]:
        """Write one request; returns its id, whether it was pipelined, bytes sent."""
        if not self.send_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"peer {self.label}: timed out waiting to send")
        try:
            with self.cond:
                if self.broken is not None:
                    raise ConnectionError(f"peer {self.label}: {self.broken}")
                rid, self.next_id = self.next_id, self.next_id + 1
                pipelined = bool(self.queue)
                self.queue.append(rid)  # under send_lock: queue order is wire order
            header["id"] = rid
            try:
                head = pp.frame(header, payload_len)
                sent = pp.send_buffers(self.sock, itertools.chain((head,), parts), deadline)
            except BaseException as exc:
                self.fail(f"send failed: {exc!r}")  # a partial frame desynchronises the stream
                raise
        finally:
            self.send_lock.release()
        return rid, pipelined, sent

    @contextmanager
    def reply(self, rid: int, deadline: float) -> Iterator[tuple[pp.Reply | pp.Error, Payload]]:
        """Wait until reply ``rid`` is next on the wire, then read it in this thread."""
        with self.cond:
            while self.broken is None and self.queue[0] != rid:
                if not self.cond.wait(deadline - time.monotonic()):
                    # our reply will still arrive, behind one nobody reads in time:
                    # the stream cannot be resynchronised, so give the connection up
                    self._fail_locked("timed out behind an earlier reply")
                    raise TimeoutError(f"peer {self.label}: request timed out")
            if self.broken is not None:
                raise ConnectionError(f"peer {self.label}: {self.broken}")
        try:
            head, payload_len = self.reader.read_head(self.sock, deadline, self.max_payload)
            message = pp.parse_message(head, payload_len)
            if isinstance(message, pp.Error) and message.rid == 0:
                raise ConnectionError(f"peer {self.label} closed the connection: "
                                      f"{message.code}: {message.message}")
            if not isinstance(message, pp.Reply | pp.Error) or message.rid != rid:
                raise ProtocolError(f"expected the reply to request {rid}")
            payload = Payload(self.sock, payload_len, deadline)
            yield message, payload
            if payload.remaining:
                pp.skip(self.sock, payload.remaining, deadline)
        except BaseException as exc:
            self.fail(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            with self.cond:
                if self.queue and self.queue[0] == rid:
                    self.queue.popleft()
                self.cond.notify_all()

    def _fail_locked(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
            with contextlib.suppress(OSError):  # wakes a blocked reader; close() comes later
                self.sock.shutdown(socket.SHUT_RDWR)
        self.cond.notify_all()

    def fail(self, reason: str) -> None:
        with self.cond:
            self._fail_locked(reason)

    def close(self) -> None:
        self.fail("closed")
        self.sock.close()


@dataclass(eq=False)
class Peer:
    """One server: its connection slots, its back-off after a failure, its counts."""

    index: int
    host: str
    port: int
    slots: list[Conn | None]
    label: str = ""
    slot_locks: list[threading.Lock] = field(default_factory=list)
    rr: Iterator[int] = field(default_factory=itertools.count)
    lock: threading.Lock = field(default_factory=threading.Lock)
    backoff: float = 0.0
    down_until: float = 0.0
    last_error: str = ""
    up: bool = False
    #: slots that have had a connection: connecting one of them again is a reconnect
    used: set[int] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("requests", "failures", "reconnects"), 0))

    def __post_init__(self) -> None:
        self.label = pp.format_address(self.host, self.port)
        self.slot_locks = [threading.Lock() for _ in self.slots]

    def fault(self, error: str) -> None:
        with self.lock:
            self.backoff = min(BACKOFF_MAX, self.backoff * 2 or BACKOFF_FIRST)
            self.down_until = time.monotonic() + self.backoff
            if self.up or error != self.last_error:
                log.warning("peer %s failed: %s; retrying in %.1fs", self.label, error,
                            self.backoff)
            self.last_error, self.up = error, False
            self.counts["failures"] += 1
        self.drop(error)  # the others are as likely dead or stuck: reconnect after the back-off

    def drop(self, reason: str) -> None:
        for conn in list(self.slots):
            if conn is not None:
                conn.fail(reason)

    def connection(self, connect: Callable[[Peer, float], Conn], deadline: float) -> Conn:
        index = next(self.rr) % len(self.slots)
        conn = self.slots[index]
        if conn is not None and conn.broken is None:
            return conn
        if not self.slot_locks[index].acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"peer {self.label}: timed out waiting for a connection")
        try:
            conn = self.slots[index]
            if conn is not None and conn.broken is None:
                return conn  # another thread reconnected meanwhile
            if conn is not None:
                conn.close()
                self.slots[index] = None
            if time.monotonic() < self.down_until:
                raise PeerDown(f"peer {self.label} is down ({self.last_error})")
            try:
                conn = connect(self, deadline)
            except (RefusedError, OSError, ProtocolError) as exc:
                self.fault(str(exc) or type(exc).__name__)
                if isinstance(exc, RefusedError):
                    raise
                raise PeerDown(f"peer {self.label}: {exc}") from exc
            with self.lock:
                self.counts["reconnects"] += index in self.used
                self.used.add(index)
                self.up, self.backoff, self.last_error = True, 0.0, ""
            self.slots[index] = conn
            return conn
        finally:
            self.slot_locks[index].release()


def connect(peer: Peer, deadline: float, *, namespace: str, secret: bytes | None,
            max_payload: int, timeout: float) -> Conn:
    """A connection to ``peer``, handshake done, within ``timeout`` and ``deadline``."""
    deadline = min(deadline, time.monotonic() + timeout)
    sock = socket.create_connection((peer.host, peer.port),
                                    timeout=max(0.001, deadline - time.monotonic()))
    try:
        pp.tune(sock)
        limit, extras = pp.client_greeting(sock, namespace=namespace, secret=secret,
                                           max_payload=max_payload, label=peer.label,
                                           deadline=deadline)
    except BaseException:
        sock.close()
        raise
    return Conn(sock, peer.label, limit, extras)


def chunks(keys: Sequence[bytes], indices: list[int], sizes: list[int] | None,
           limit: int, hard: bool) -> Iterator[list[int]]:
    """Split a peer's share so each request fits the key, header and payload limits.

    ``hard``: ``sizes`` are what the requests carry (PUT), so a block beyond
    ``limit`` is left out (refused); otherwise they only shape the replies.
    """
    chunk: list[int] = []
    header = payload = 0
    for i in indices:
        cost = len(keys[i]) + 12  # bin header + a size entry, generously
        size = sizes[i] if sizes is not None else 0
        if hard and size > limit:
            continue
        if chunk and (len(chunk) >= pp.MAX_KEYS or header + cost > HEADER_BUDGET
                      or payload + size > limit):
            yield chunk
            chunk, header, payload = [], 0, 0
        chunk.append(i)
        header += cost
        payload += size
    if chunk:
        yield chunk
