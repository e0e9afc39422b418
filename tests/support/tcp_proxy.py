"""A loopback TCP proxy in front of a real server, that can cut or drop its connections.

The ``object`` tier's socket reads (backends/object/socket_reads.py) are tested
against SeaweedFS through it: a response cut inside its body, and kept-alive
connections the server closed between two reads.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType

__all__ = ["TcpProxy"]


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target``.

    ``cut_next(n, after)``: the next ``n`` connections' responses end (both
    sides closed) after ``after`` bytes.  ``cut_all(after)``: every
    connection, open or new, ends after ``after`` more bytes of response.
    ``close_all()``: every open connection closed, as a server's idle
    timeout or restart does.  ``stalled``: set, no response byte is forwarded.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cuts: list[int] = []
        self._cut_all: tuple[int, int] | None = None  # (generation, bytes)
        self.connections = 0
        self.stalled = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tcp-proxy")
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut_next(self, n: int, after: int) -> None:
        with self._lock:
            self._cuts.extend([after] * n)

    def cut_all(self, after: int) -> None:
        with self._lock:
            generation = self._cut_all[0] + 1 if self._cut_all else 1
            self._cut_all = (generation, after)

    def close_all(self) -> None:
        with self._lock:
            socks, self._open = self._open, set()
        for sock in socks:
            _close(sock)

    def close(self) -> None:
        self._listener.close()
        self.close_all()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(self._target)
            with self._lock:
                self.connections += 1
                cut = self._cuts.pop(0) if self._cuts else None
                self._open.update((client, server))
            threading.Thread(target=self._pump, args=(client, server, None, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, cut, True),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, cut: int | None,
              response: bool) -> None:
        sent, generation = 0, 0
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                while response and self.stalled.is_set():
                    time.sleep(0.01)
                if response and self._cut_all is not None and self._cut_all[0] != generation:
                    generation, cut = self._cut_all[0], self._cut_all[1]
                    sent = 0  # counted from the call on
                if cut is not None and sent + len(data) >= cut:
                    dst.sendall(data[: cut - sent])
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for sock in (src, dst):
            _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the other side
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
