"""GETs over plain HTTP whose bodies land straight in the caller's buffers (``socket_reads``).

obstore receives a body into buffers of its own, which :func:`.reads.read_into`
then copies into the engine's rows: two passes over every byte, and the
client's own work, on machines where the bucket's server shares the CPUs.
Against SeaweedFS on two cores, 64 objects of 2 MiB on 16 threads took 172 ms
and 166 ms of CPU by obstore (``.bytes()``, no copy at all), 125 ms and 60 ms
here (BENCHMARKS.md, "Object bodies received in place").

So where the endpoint speaks plain ``http://``, a read signs the GET with
obstore (a presigned URL: the same credentials and signature as its own
requests), sends it on a kept-alive connection of the calling thread, and
receives the body with one ``recvmsg_into`` across the caller's buffers
(``MSG_WAITALL``): the kernel copies each byte once, into the row, with the
GIL released.  Every answer this path does not expect (a status other than
200 and 404, a chunked or unsized body, a header it cannot read, a socket
error, an expired signature) closes the connection and hands the read to
obstore (:func:`.reads.read_into`), which retries and turns the fault into a
typed error as every other request does; a read answered that way is counted
in ``socket_fallbacks``.  A request with no answer within ``request_timeout``
is a fault at once: a server that stalls one would stall obstore's as well.
The bytes are checked by the tier as every block is: a body cut short or of
another size is a miss, never data.

HTTPS endpoints (and AWS) go through obstore: TLS decrypts into buffers of
its own anyway.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import obstore
from obstore.store import S3Store

from .reads import read_into

__all__ = ["HEADER_MAX", "SIGNED_FOR", "SocketReads"]

#: The longest response header read before the path gives up (S3 sends under 1 KiB),
#: and the longest 404 body read off a connection to keep it (longer: it is closed).
HEADER_MAX = 16 << 10
#: How long a presigned URL stays valid: it is sent at once, so any bound over a
#: request's duration will do.
SIGNED_FOR = timedelta(minutes=15)
#: Bytes asked for by the first receive of a response: its header and the body's start.
_FIRST = 8 << 10


class _NotHere(Exception):
    """An answer the socket path does not handle: obstore reads it instead."""


class _Connection:
    """One kept-alive connection of one thread to the endpoint."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.used = False  # a reused connection may have been closed by the server


class SocketReads:
    """Plain-HTTP GETs into the caller's buffers, one connection per thread."""

    def __init__(self, store: S3Store, host: str, port: int, *, timeout: float,
                 connect_timeout: float) -> None:
        self._store = store
        self._address = (host, port)
        self._timeout, self._connect_timeout = timeout, connect_timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[_Connection] = set()
        self._counts = {"socket_reads": 0, "socket_fallbacks": 0}

    @classmethod
    def for_options(cls, store: S3Store, options: Mapping[str, Any]) -> SocketReads | None:
        """The reads for a tier's options; None where its requests go through obstore only
        (``socket_reads`` off, or an endpoint that is not ``http://``)."""
        endpoint = options["endpoint"] or ""
        if not options["socket_reads"] or not endpoint.lower().startswith("http://"):
            return None
        where = urlsplit(endpoint)
        if where.hostname is None:
            return None
        return cls(store, where.hostname, where.port or 80, timeout=options["request_timeout"],
                   connect_timeout=options["connect_timeout"])

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def close(self) -> None:
        """Close every connection (the threads' next reads open new ones)."""
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            conn.sock.close()

    def read_into(self, path: str, scatter: Sequence[memoryview]) -> tuple[int, datetime] | None:
        """:func:`.reads.read_into`'s answer for ``path``, the body received in place."""
        try:
            got = self._read(path, scatter)
        except (TimeoutError, BlockingIOError) as exc:  # SO_RCVTIMEO, SO_SNDTIMEO ran out
            # a server that stalls one request would stall obstore's too: a fault now,
            # not a second wait of request_timeout
            self._drop()
            raise TimeoutError(f"no answer within {self._timeout:g} s ({path})") from exc
        except (OSError, _NotHere, ValueError):
            self._drop()
            self._count("socket_fallbacks")
            return read_into(self._store, path, scatter)
        self._count("socket_reads")
        return got

    # one request ------------------------------------------------------------
    def _read(self, path: str, scatter: Sequence[memoryview]) -> tuple[int, datetime] | None:
        url = urlsplit(obstore.sign(self._store, "GET", path, SIGNED_FOR))
        target = f"{url.path}?{url.query}" if url.query else url.path
        request = (f"GET {target} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                   f"User-Agent: kvtier\r\n\r\n").encode("ascii")
        conn = self._connection()
        try:
            first = _ask(conn.sock, request)
        except (TimeoutError, BlockingIOError):
            raise  # a stalled server, not a closed connection
        except OSError:  # reset: the server closed the idle connection
            if not conn.used:
                raise
            first = b""
        if not first and conn.used:  # the server closed the idle connection: once more, anew
            self._drop()
            conn = self._connection()
            first = _ask(conn.sock, request)
        conn.used = True
        status, headers, body = self._header(conn.sock, first)
        size = _length(headers)
        keep = headers.get("connection", "").lower() != "close"
        if status == 404:
            if size > HEADER_MAX or not keep:  # not read: the connection goes instead
                self._drop()
            else:  # the error document, read off so that the connection serves again
                self._receive(conn.sock, body, [memoryview(bytearray(size))] if size else [])
            return None
        if status != 200:
            raise _NotHere(f"status {status}")
        modified = parsedate_to_datetime(headers.get("last-modified", ""))  # or ValueError
        if modified.tzinfo is None:
            raise _NotHere("last-modified without a zone")
        if size != sum(v.nbytes for v in scatter):
            self._drop()  # the body stays unread: the tier reads it whole by get
            return size, modified
        self._receive(conn.sock, body, scatter)
        if not keep:
            self._drop()
        return size, modified

    def _header(self, sock: socket.socket,
                got: bytes) -> tuple[int, dict[str, str], memoryview]:
        """The response's status and headers, and the body's first bytes received with them."""
        data = bytearray(got)
        while (end := data.find(b"\r\n\r\n")) < 0:
            if not got or len(data) > HEADER_MAX:
                raise _NotHere("no complete response header")
            got = sock.recv(_FIRST)
            data += got
        lines = bytes(data[:end]).decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise _NotHere(f"not an HTTP/1 response: {lines[0][:40]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise _NotHere("a header line without a colon")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise _NotHere("a chunked body")
        return int(rest.split(" ", 1)[0]), headers, memoryview(data)[end + 4:]

    @staticmethod
    def _receive(sock: socket.socket, body: memoryview, scatter: Sequence[memoryview]) -> None:
        """Fill ``scatter`` with ``body``'s bytes, then the rest from ``sock``."""
        views = [v for v in scatter if v.nbytes]
        if body.nbytes > sum(v.nbytes for v in views):
            raise _NotHere("more body than its length")
        while body.nbytes:  # what came with the header: copied, a few KiB
            n = min(body.nbytes, views[0].nbytes)
            views[0][:n] = body[:n]
            body = body[n:]
            _skip(views, n)
        while views:
            # one call, the GIL released, until every buffer is full (or a signal, a
            # timeout, the end: whatever came is skipped and the rest asked again)
            n = sock.recvmsg_into(views, 0, socket.MSG_WAITALL)[0]
            if n == 0:
                raise _NotHere("the connection ended inside the body")
            _skip(views, n)

    # connections ------------------------------------------------------------
    def _connection(self) -> _Connection:
        conn: _Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        sock = socket.create_connection(self._address, timeout=self._connect_timeout)
        sock.settimeout(None)  # blocking: MSG_WAITALL waits in the kernel, without the GIL
        limit = struct.pack("ll", int(self._timeout), int(self._timeout % 1 * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = self._local.conn = _Connection(sock)
        with self._lock:
            self._open.add(conn)
        return conn

    def _drop(self) -> None:
        """Close the calling thread's connection, if any."""
        conn: _Connection | None = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with self._lock:
                self._open.discard(conn)
            conn.sock.close()

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1


def _skip(views: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes of ``views``, and the views they empty."""
    while n:
        take = min(n, views[0].nbytes)
        n -= take
        views[0] = views[0][take:]
        if not views[0].nbytes:
            views.pop(0)


def _ask(sock: socket.socket, request: bytes) -> bytes:
    """Send ``request``; the response's first bytes (b"" where the server closed)."""
    sock.sendall(request)
    return sock.recv(_FIRST)


def _length(headers: Mapping[str, str]) -> int:
    """The body's Content-Length; _NotHere where it is missing or not a count."""
    value = headers.get("content-length", "")
    if not value.isdigit():
        raise _NotHere(f"content-length {value!r}")
    return int(value)
