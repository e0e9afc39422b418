"""The limits of ``kvtier serve``: connection slots, and payload memory.

:class:`Connections` admits each accepted socket to a slot.  Connections not
yet authenticated (the handshake is not done) have a budget of their own,
smaller than the total; when it is full, the oldest of them is closed to
admit the newcomer.  So idle or slow sockets from anyone who can reach the
port never hold the slots of clients that know the secret: 300 idle sockets
took all 256 slots, and a client with the secret was refused as "busy"
until their handshake deadline.  A flood of new sockets faster than a
client's handshake (two round trips) can still push it out.

:class:`Connections` also ends connections at shutdown: ``shutdown()`` on
their sockets wakes every wait on them (``poll``, a blocking ``recv``), so a
thread sending to a stopped client gives up at once instead of at its frame
deadline.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Connection", "Connections", "PayloadBudget"]


@dataclass(eq=False)
class Connection:
    """One accepted socket and the thread that serves it."""

    sock: socket.socket
    label: str
    thread: threading.Thread | None = None
    authenticated: bool = False
    accepted: float = field(default_factory=time.monotonic)


class Connections:
    """At most ``limit`` connections; at most ``unauthenticated`` of them before the handshake."""

    def __init__(self, limit: int, unauthenticated: int) -> None:
        self.limit = limit
        self.unauthenticated = min(unauthenticated, limit)
        self._lock = threading.Lock()
        self._open: dict[Connection, None] = {}  # insertion order: oldest first
        self._pending: dict[Connection, None] = {}  # not yet authenticated, oldest first

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def admit(
        self, sock: socket.socket, label: str, serve: Callable[[Connection], None]
    ) -> tuple[Connection | None, Connection | None]:
        """``(the new connection or None if every slot is authenticated, the one closed for it)``.

        The caller starts the new connection's thread.
        """
        evicted = None
        with self._lock:
            if len(self._pending) >= self.unauthenticated or len(self._open) >= self.limit:
                if not self._pending:
                    return None, None
                evicted = next(iter(self._pending))
                self._drop(evicted)
                _shut(evicted.sock)  # its thread sees the end of the stream and leaves
            conn = Connection(sock, label)
            conn.thread = threading.Thread(target=serve, args=(conn,), daemon=True,
                                           name=f"kvtier-serve {label}")
            self._open[conn] = None
            self._pending[conn] = None
        return conn, evicted

    def authenticated(self, conn: Connection) -> None:
        """``conn`` passed its handshake: it leaves the unauthenticated budget."""
        with self._lock:
            conn.authenticated = True
            self._pending.pop(conn, None)

    def leave(self, conn: Connection) -> None:
        """``conn``'s thread is done with it: free the slot, then close the socket."""
        with self._lock:
            self._drop(conn)
        conn.sock.close()  # after leaving: nobody shuts down a closed (reused) descriptor

    def shut(self, *, pending_only: bool = False) -> list[str]:
        """Shut down open connections (those not authenticated only, if asked); their labels."""
        with self._lock:
            conns = list(self._pending if pending_only else self._open)
            for conn in conns:
                _shut(conn.sock)
        return [conn.label for conn in conns]

    def join(self, deadline: float) -> bool:
        """Wait until every connection's thread has finished, or ``deadline``; True if all did."""
        with self._lock:
            threads = [c.thread for c in self._open if c.thread is not None]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    def _drop(self, conn: Connection) -> None:
        self._open.pop(conn, None)
        self._pending.pop(conn, None)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already reset by the other end
        sock.shutdown(socket.SHUT_RDWR)


class PayloadBudget:
    """Bytes of PUT payloads being received, all connections together: bounded, so
    that 256 connections cannot each hold 256 MiB at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.cond = threading.Condition()
        self.closed = False

    def take(self, nbytes: int, deadline: float) -> None:
        with self.cond:
            while self.used and self.used + nbytes > self.limit:
                if self.closed or not self.cond.wait(deadline - time.monotonic()):
                    raise TimeoutError("payload memory exhausted")
            self.used += nbytes

    def give(self, nbytes: int) -> None:
        with self.cond:
            self.used -= nbytes
            self.cond.notify_all()

    def close(self) -> None:
        """Waiters give up at once (the server is shutting down)."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
