"""Wire protocol between ``kvtier serve`` and the ``peer`` backend.

Every message is one frame::

    b"KVTP" | header length (u32 LE) | payload length (u32 LE) | msgpack header | payload

The 12-byte prefix never changes between protocol versions, so a reader can
always size (or refuse) what follows.  The header is a msgpack map with
short string keys; ``t`` names the message type.  The payload is raw bytes:
stored blocks concatenated, in key order, their sizes in the header.

Limits, checked before anything is allocated: header <= :data:`MAX_HEADER`,
payload <= the reader's ``max_payload`` (default :data:`DEFAULT_MAX_PAYLOAD`),
at most :data:`MAX_KEYS` keys of 1 to :data:`MAX_KEY_LEN` bytes per request,
and msgpack is unpacked with explicit ``max_*_len`` limits.  (4096 keys of
64 bytes do not fit in one header: senders split batches by header size too.)  Any violation
raises :class:`ProtocolError`; nothing here executes code from the wire.

Handshake (no payloads)::

    client: HELLO   {v, ns: namespace hex, n: client nonce, a: wants auth, mp: max payload}
    server: WELCOME {v, n: server nonce, a: auth required, mp: max payload}
            or ERROR {c: "version", v: server version, m}     (then closes)
    client: AUTH    {mac: HMAC(secret, "client" transcript)}  only when a secret is in use
    server: AUTH_OK {mac: HMAC(secret, "server" transcript)}  the server proves it too
            or ERROR {c: "auth", m}                            (then closes)

The transcript is ``kvtier-peer|1|<role>|<ns>|<client nonce>|<server nonce>``:
fresh nonces on both sides defeat replay, the role defeats reflection, and
the secret never travels.  Both sides then keep payloads within the smaller
``mp``.

Requests carry ``id`` and are batched (``k``: list of keys)::

    GET    {id, k}                        -> REPLY {id, s: [size | None | -1]} + blobs
    PUT    {id, k, s: [size]} + blobs     -> REPLY {id, r: [stored]}
    LOOKUP {id, k}                        -> REPLY {id, r: [found]}
    EVICT  {id, k}                        -> REPLY {id, r: [removed]}
    STATS  {id}                           -> REPLY {id} + msgpack stats map
    KEEP   {id, k}                        -> REPLY {id, o: [kept | None]}   (optional)
    RELEASE {id, k}                       -> REPLY {id, o: [True | None]}   (optional)
    EXPIRE {id, k, d}                     -> REPLY {id, o: [set | None]}    (optional)
    DEADLINES {id, k}                     -> REPLY {id, l: [seconds | None]} (optional)
    any                                   -> ERROR {id, c, m} (the request failed)

Optional requests are sent only to a server whose WELCOME lists them in
``x`` (a list of message types; a server of before them sends no ``x``, and
would close a connection on a type it does not know).  KEEP and RELEASE mark
blocks kept, or release them, at the tiers of the connection's chain
(``kvtier_keep``): per key True, False (refused) or None (not held there).
EXPIRE gives blocks a deadline ``d`` seconds from now (finite, above 0) at
those tiers (``kvtier_expire``), answered the same way.  DEADLINES asks those
tiers what deadlines are left (``kvtier_deadlines``): per key the earliest of
them, in seconds (finite, above 0), or None where no tier holds one.

In a GET reply ``None`` is a miss and ``-1`` a block that did not fit in this
reply's payload limit: ask for it again.  The server answers the requests of
one connection one after another, so replies arrive **in request order**;
clients still match them by ``id``.  Several requests may be in flight on a
connection (pipelining): the client writes them back to back.

The socket I/O under it all, every call bounded by a deadline, is
:mod:`kvtier.peer._sockio`; its functions are used through the names here.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from kvtier.peer._sockio import recv_blocks, recv_exact, send_buffers, skip, tune, wait_io
from kvtier.spec import (
    MAX_KEY_SIZE,
    BytesLike,
    ConnectionClosedError,
    ProtocolError,
    RefusedError,
    VersionMismatchError,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "MAGIC",
    "MAX_HEADER",
    "MAX_KEYS",
    "MAX_KEY_LEN",
    "PROTOCOL_VERSION",
    "FrameReader",
    "client_greeting",
    "client_handshake",
    "decode_frame",
    "format_address",
    "frame",
    "parse_address",
    "parse_message",
    "recv_blocks",
    "recv_exact",
    "send_buffers",
    "server_handshake",
    "skip",
    "tune",
    "wait_io",
]

PROTOCOL_VERSION = 1
MAGIC = b"KVTP"
PREFIX = struct.Struct("<4sII")
MAX_HEADER = 64 * 1024
DEFAULT_MAX_PAYLOAD = 256 << 20
MAX_KEYS = 4096
MAX_KEY_LEN = MAX_KEY_SIZE
NONCE_LEN = 32
MAC_LEN = 32
#: Longest string in a header (error messages are cut to fit).
MAX_STR = 1024
#: Largest payload the u32 length field can declare.
MAX_U32 = 0xFFFFFFFF

# message types (plain ints: they travel as msgpack ints)
HELLO, WELCOME, AUTH, AUTH_OK, ERROR = 1, 2, 3, 4, 5
GET, PUT, LOOKUP, EVICT, STATS, KEEP, RELEASE, EXPIRE = 16, 17, 18, 19, 20, 21, 22, 23
DEADLINES = 24
REPLY = 32
#: Requests a server answers only if its WELCOME lists them (``x``).
OPTIONAL = frozenset({KEEP, RELEASE, EXPIRE, DEADLINES})
REQUESTS = frozenset({GET, PUT, LOOKUP, EVICT, STATS}) | OPTIONAL
NAMES = {HELLO: "HELLO", WELCOME: "WELCOME", AUTH: "AUTH", AUTH_OK: "AUTH_OK",
         ERROR: "ERROR", GET: "GET", PUT: "PUT", LOOKUP: "LOOKUP", EVICT: "EVICT",
         STATS: "STATS", KEEP: "KEEP", RELEASE: "RELEASE", EXPIRE: "EXPIRE",
         DEADLINES: "DEADLINES", REPLY: "REPLY"}
#: Size of a GET reply entry for a block that did not fit: ask again.
RETRY = -1


# -------------------------------------------------------------------------
# messages
# -------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    version: int
    namespace: str
    nonce: bytes
    auth: bool
    max_payload: int


@dataclass(frozen=True)
class Welcome:
    version: int
    nonce: bytes
    auth: bool
    max_payload: int
    extras: frozenset[int] = frozenset()  # the optional requests the server answers


@dataclass(frozen=True)
class Auth:
    kind: int  # AUTH or AUTH_OK
    mac: bytes


@dataclass(frozen=True)
class Error:
    rid: int
    code: str
    message: str
    version: int | None


@dataclass(frozen=True)
class Request:
    kind: int
    rid: int
    keys: list[bytes]
    sizes: list[int]  # PUT only, else empty
    after: float = 0.0  # EXPIRE only: the deadline, seconds from now


@dataclass(frozen=True)
class Reply:
    rid: int
    sizes: list[int | None] | None  # GET
    flags: list[bool] | None  # PUT, LOOKUP, EVICT
    marks: list[bool | None] | None = None  # KEEP, RELEASE, EXPIRE
    left: list[float | None] | None = None  # DEADLINES: seconds, finite and above 0


Message = Hello | Welcome | Auth | Error | Request | Reply


def _field(h: dict[str, Any], name: str) -> Any:
    try:
        return h[name]
    except KeyError:
        raise ProtocolError(f"header lacks field {name!r}") from None


def _int(h: dict[str, Any], name: str, lo: int = 0, hi: int = (1 << 63) - 1) -> int:
    value = _field(h, name)
    # bool is an int in Python but never a valid number here
    if type(value) is not int or not lo <= value <= hi:
        raise ProtocolError(f"field {name!r} must be an integer in [{lo}, {hi}]")
    return value


def _bool(h: dict[str, Any], name: str) -> bool:
    value = _field(h, name)
    if type(value) is not bool:
        raise ProtocolError(f"field {name!r} must be a boolean")
    return value


def _bin(h: dict[str, Any], name: str, size: int) -> bytes:
    value = _field(h, name)
    if type(value) is not bytes or len(value) != size:
        raise ProtocolError(f"field {name!r} must be {size} bytes")
    return value


def _str(h: dict[str, Any], name: str) -> str:
    value = _field(h, name)
    if type(value) is not str:
        raise ProtocolError(f"field {name!r} must be a string")
    return value


def _keys(h: dict[str, Any]) -> list[bytes]:
    keys = _field(h, "k")
    if type(keys) is not list or len(keys) > MAX_KEYS:
        raise ProtocolError(f"field 'k' must be a list of at most {MAX_KEYS} keys")
    for key in keys:
        if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_LEN:
            raise ProtocolError(f"keys must be 1 to {MAX_KEY_LEN} bytes")
    return keys


def _list(h: dict[str, Any], name: str) -> list[Any]:
    value = _field(h, name)
    if type(value) is not list:
        raise ProtocolError(f"field {name!r} must be a list")
    return value


def _no_payload(kind: int, payload_len: int) -> None:
    if payload_len:
        raise ProtocolError(f"{NAMES[kind]} carries no payload, got {payload_len} bytes")


def parse_message(h: dict[str, Any], payload_len: int) -> Message:
    """Check a decoded header (and its payload length) and return the typed message.

    Raises :class:`ProtocolError` for anything the protocol does not allow,
    :class:`VersionMismatchError` for a HELLO or WELCOME of another version.
    """
    kind = _int(h, "t", 0, 255)
    if kind in (HELLO, WELCOME):
        return _greeting(kind, h, payload_len)
    if kind in (AUTH, AUTH_OK):
        _no_payload(kind, payload_len)
        return Auth(kind, _bin(h, "mac", MAC_LEN))
    if kind == ERROR:
        _no_payload(kind, payload_len)
        theirs = _int(h, "v", 0, 1 << 31) if "v" in h else None
        return Error(_int(h, "id"), _str(h, "c"), _str(h, "m"), theirs)
    if kind in REQUESTS:
        return _request(kind, h, payload_len)
    if kind == REPLY:
        return _reply(h, payload_len)
    raise ProtocolError(f"unknown message type {kind}")


def _greeting(kind: int, h: dict[str, Any], payload_len: int) -> Hello | Welcome:
    # the version is checked first: the rest of a future HELLO may differ
    version = _int(h, "v", 0, 1 << 31)
    if version != PROTOCOL_VERSION:
        raise VersionMismatchError(f"peer speaks protocol {version}, this side "
                                   f"{PROTOCOL_VERSION}", version)
    _no_payload(kind, payload_len)
    if kind == WELCOME:
        extras = _list(h, "x") if "x" in h else []  # unknown types: a newer server's
        if any(type(x) is not int for x in extras):
            raise ProtocolError("field 'x' must be a list of message types")
        return Welcome(version, _bin(h, "n", NONCE_LEN), _bool(h, "a"),
                       _int(h, "mp", 1024, MAX_U32), frozenset(extras) & OPTIONAL)
    namespace = _str(h, "ns")
    if len(namespace) != 32 or namespace.strip("0123456789abcdef"):
        raise ProtocolError("field 'ns' must be 32 lowercase hex digits")
    return Hello(version, namespace, _bin(h, "n", NONCE_LEN), _bool(h, "a"),
                 _int(h, "mp", 1024, MAX_U32))


def _request(kind: int, h: dict[str, Any], payload_len: int) -> Request:
    rid = _int(h, "id")
    if kind == STATS:
        _no_payload(kind, payload_len)
        return Request(kind, rid, [], [])
    keys = _keys(h)
    if kind == EXPIRE:
        _no_payload(kind, payload_len)
        after = _field(h, "d")  # a float (an int from a client that rounds), never a bool
        if type(after) not in (float, int) or not 0 < after < math.inf:
            raise ProtocolError("EXPIRE field 'd' must be a number of seconds above 0")
        return Request(kind, rid, keys, [], float(after))
    if kind != PUT:
        _no_payload(kind, payload_len)
        return Request(kind, rid, keys, [])
    sizes = _list(h, "s")
    if len(sizes) != len(keys) or any(type(s) is not int or s < 0 for s in sizes):
        raise ProtocolError("PUT sizes must be one non-negative integer per key")
    if sum(sizes) != payload_len:
        raise ProtocolError(f"PUT sizes add up to {sum(sizes)}, payload is {payload_len}")
    return Request(kind, rid, keys, sizes)


def _reply(h: dict[str, Any], payload_len: int) -> Reply:
    rid = _int(h, "id")
    if "s" in h:
        sizes = _list(h, "s")
        if len(sizes) > MAX_KEYS or any(
            s is not None and (type(s) is not int or s < RETRY) for s in sizes
        ):
            raise ProtocolError("GET reply sizes must be integers >= -1 or nil")
        if sum(s for s in sizes if s is not None and s > 0) != payload_len:
            raise ProtocolError("GET reply sizes do not add up to its payload")
        return Reply(rid, sizes, None)
    if "r" in h:
        _no_payload(REPLY, payload_len)
        flags = _list(h, "r")
        if len(flags) > MAX_KEYS or any(type(f) is not bool for f in flags):
            raise ProtocolError("reply flags must be booleans")
        return Reply(rid, None, flags)
    if "o" in h:
        _no_payload(REPLY, payload_len)
        marks = _list(h, "o")
        if len(marks) > MAX_KEYS or any(m is not None and type(m) is not bool for m in marks):
            raise ProtocolError("reply outcomes must be booleans or nil")
        return Reply(rid, None, None, marks)
    if "l" in h:
        _no_payload(REPLY, payload_len)
        left = _list(h, "l")
        if len(left) > MAX_KEYS or any(s is not None and (type(s) not in (float, int)
                                                          or not 0 < s < math.inf) for s in left):
            raise ProtocolError("reply deadlines must be seconds above 0 or nil")
        return Reply(rid, None, None, None, [None if s is None else float(s) for s in left])
    return Reply(rid, None, None)  # STATS: the payload is a msgpack map


# -------------------------------------------------------------------------
# frames
# -------------------------------------------------------------------------


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> ``(host, port)``; ValueError otherwise."""
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def frame(header: dict[str, Any], payload_len: int = 0) -> bytes:
    """Prefix and header of a frame; the payload follows as separate buffers."""
    body: bytes = msgpack.packb(header, use_bin_type=True)
    if len(body) > MAX_HEADER:
        raise ProtocolError(f"header of {len(body)} bytes exceeds {MAX_HEADER}")
    if not 0 <= payload_len <= MAX_U32:
        raise ProtocolError(f"payload of {payload_len} bytes cannot be framed")
    return PREFIX.pack(MAGIC, len(body), payload_len) + body


def error_frame(rid: int, code: str, message: str, **extra: Any) -> bytes:
    # msgpack limits strings in bytes: cut the UTF-8 form, not the characters
    text = message.encode()[: MAX_STR - 8].decode(errors="ignore")
    return frame({"t": ERROR, "id": rid, "c": code[:32], "m": text, **extra})


def parse_prefix(prefix: BytesLike, max_payload: int) -> tuple[int, int]:
    """Header and payload lengths from a 12-byte prefix, checked against the limits."""
    magic, header_len, payload_len = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}: not a kvtier peer frame")
    if not 0 < header_len <= MAX_HEADER:
        raise ProtocolError(f"header length {header_len} outside 1..{MAX_HEADER}")
    if payload_len > max_payload:
        raise ProtocolError(f"payload length {payload_len} exceeds the limit {max_payload}")
    return header_len, payload_len


def unpack_header(data: BytesLike) -> dict[str, Any]:
    """Decode a msgpack header with hard limits; a map with string keys or ProtocolError."""
    try:
        header = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=max(MAX_KEY_LEN, MAC_LEN, NONCE_LEN),
            max_str_len=MAX_STR,
            max_array_len=MAX_KEYS,
            max_map_len=16,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"unreadable header: {type(exc).__name__}: {exc}") from None
    if type(header) is not dict or not all(type(k) is str for k in header):
        raise ProtocolError("header is not a map with string keys")
    return header


def decode_frame(
    data: BytesLike, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> tuple[dict[str, Any], memoryview]:
    """Decode one complete frame held in memory: ``(header, payload view)``.

    The buffer must hold exactly one frame.  Nothing is copied or allocated
    beyond the decoded header.
    """
    view = memoryview(data).cast("B")
    if view.nbytes < PREFIX.size:
        raise ProtocolError("truncated frame prefix")
    header_len, payload_len = parse_prefix(view[: PREFIX.size], max_payload)
    end = PREFIX.size + header_len
    if view.nbytes != end + payload_len:
        raise ProtocolError(f"frame holds {view.nbytes} bytes, its prefix declares "
                            f"{end + payload_len}")
    return unpack_header(view[PREFIX.size : end]), view[end:]


class FrameReader:
    """Reads frame heads from a socket into buffers allocated once per connection."""

    def __init__(self) -> None:
        self._prefix = bytearray(PREFIX.size)
        self._header = bytearray(MAX_HEADER)
        self._view = memoryview(self._header)

    def read_head(
        self, sock: socket.socket, deadline: float, max_payload: int
    ) -> tuple[dict[str, Any], int]:
        """Read prefix and header; returns the header and the payload length to read next.

        The payload length is refused against ``max_payload`` before the
        caller allocates anything for it.
        """
        try:
            recv_exact(sock, memoryview(self._prefix), deadline)
        except ConnectionClosedError as exc:
            if exc.received:
                raise
            raise ConnectionClosedError("connection closed by peer between frames") from None
        header_len, payload_len = parse_prefix(self._prefix, max_payload)
        recv_exact(sock, self._view[:header_len], deadline)
        return unpack_header(self._view[:header_len]), payload_len


# -------------------------------------------------------------------------
# authentication: HMAC-SHA256 over both nonces, never the secret itself
# -------------------------------------------------------------------------


def nonce() -> bytes:
    return os.urandom(NONCE_LEN)


def proof(secret: bytes, role: bytes, hello: Hello, server_nonce: bytes) -> bytes:
    """HMAC of the handshake transcript; ``role`` (client/server) stops reflection."""
    transcript = b"|".join((b"kvtier-peer", str(PROTOCOL_VERSION).encode(), role,
                            hello.namespace.encode(), hello.nonce, server_nonce))
    return hmac.new(secret, transcript, hashlib.sha256).digest()


def check_proof(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)


def unpack_stats(payload: BytesLike) -> dict[str, Any]:
    """Decode a STATS reply payload (bounded by the payload limit already checked)."""
    try:
        stats = msgpack.unpackb(payload, raw=False, strict_map_key=True, max_ext_len=0)
    except Exception as exc:
        raise ProtocolError(f"unreadable stats: {exc}") from None
    if type(stats) is not dict:
        raise ProtocolError("stats are not a map")
    return stats


def server_handshake(sock: socket.socket, reader: FrameReader, secret: bytes | None,
                     max_payload: int, deadline: float) -> Hello:
    """The server's side: HELLO -> WELCOME (-> AUTH -> AUTH_OK).

    On refusal the client is told why (an ERROR frame), then :class:`RefusedError`
    is raised; the caller closes the connection.
    """
    head, payload_len = reader.read_head(sock, deadline, 0)
    try:
        hello = parse_message(head, payload_len)
    except VersionMismatchError as exc:
        message = f"server speaks protocol {PROTOCOL_VERSION}, client {exc.version}"
        send_buffers(sock, [error_frame(0, "version", message, v=PROTOCOL_VERSION)], deadline)
        raise RefusedError(message) from None
    if not isinstance(hello, Hello):
        raise ProtocolError(f"expected HELLO, got {type(hello).__name__}")
    server_nonce = nonce()
    welcome = {"t": WELCOME, "v": PROTOCOL_VERSION, "n": server_nonce, "a": secret is not None,
               "mp": max_payload, "x": sorted(OPTIONAL)}
    send_buffers(sock, [frame(welcome)], deadline)
    if secret is None:
        return hello
    try:
        head, payload_len = reader.read_head(sock, deadline, 0)
    except ConnectionClosedError:
        raise RefusedError("client left without authenticating", auth=True) from None
    auth = parse_message(head, payload_len)
    expected = proof(secret, b"client", hello, server_nonce)
    if not (isinstance(auth, Auth) and auth.kind == AUTH and check_proof(expected, auth.mac)):
        send_buffers(sock, [error_frame(0, "auth", "authentication failed")], deadline)
        raise RefusedError("authentication failed", auth=True)
    ok = {"t": AUTH_OK, "mac": proof(secret, b"server", hello, server_nonce)}
    send_buffers(sock, [frame(ok)], deadline)
    return hello


def client_handshake(sock: socket.socket, *, namespace: str, secret: bytes | None,
                     max_payload: int, label: str, deadline: float) -> int:
    """The client's side; returns the payload limit both sides accept.

    Raises :class:`RefusedError` (naming ``label``) for a configuration mismatch.
    """
    return client_greeting(sock, namespace=namespace, secret=secret, max_payload=max_payload,
                           label=label, deadline=deadline)[0]


def client_greeting(sock: socket.socket, *, namespace: str, secret: bytes | None,
                    max_payload: int, label: str, deadline: float) -> tuple[int, frozenset[int]]:
    """:func:`client_handshake`, and the optional requests the server answers."""
    hello = Hello(PROTOCOL_VERSION, namespace, nonce(), secret is not None, max_payload)
    send_buffers(sock, [frame({"t": HELLO, "v": hello.version, "ns": namespace,
                               "n": hello.nonce, "a": hello.auth, "mp": max_payload})], deadline)
    reader = FrameReader()
    welcome = _expect(sock, reader, label, deadline)
    if not isinstance(welcome, Welcome):
        raise ProtocolError(f"peer {label}: expected WELCOME")
    if welcome.auth and secret is None:
        raise RefusedError(f"peer {label} requires authentication: set this tier's 'secret' "
                      "option (e.g. secret: ${KVTIER_PEER_SECRET})", auth=True)
    limit = min(max_payload, welcome.max_payload)
    if secret is None:
        return limit, welcome.extras
    if not welcome.auth:
        raise RefusedError(f"peer {label} does not authenticate, but this tier has a secret: "
                      "refusing a server that cannot prove it knows it (start it with "
                      "--secret-file or KVTIER_PEER_SECRET)", auth=True)
    mac = proof(secret, b"client", hello, welcome.nonce)
    send_buffers(sock, [frame({"t": AUTH, "mac": mac})], deadline)
    ok = _expect(sock, reader, label, deadline)
    if not isinstance(ok, Auth) or ok.kind != AUTH_OK:
        raise ProtocolError(f"peer {label}: expected AUTH_OK")
    if not check_proof(proof(secret, b"server", hello, welcome.nonce), ok.mac):
        raise RefusedError(f"peer {label} failed to prove it knows the secret", auth=True)
    return limit, welcome.extras


def _expect(sock: socket.socket, reader: FrameReader, label: str, deadline: float) -> Message:
    head, payload_len = reader.read_head(sock, deadline, 0)
    try:
        message = parse_message(head, payload_len)
    except VersionMismatchError as exc:
        raise RefusedError(f"peer {label}: server speaks protocol {exc.version}, "
                      f"this client {PROTOCOL_VERSION}") from None
    if isinstance(message, Error):
        if message.code == "version":
            raise RefusedError(f"peer {label}: server speaks protocol {message.version}, "
                          f"this client {PROTOCOL_VERSION}")
        if message.code == "auth":
            raise RefusedError(f"peer {label}: authentication failed (wrong secret?)", auth=True)
        if message.code == "busy":
            raise ConnectionError(f"peer {label} is busy: {message.message}")
        raise RefusedError(f"peer {label} refused the connection: {message.message}")
    return message
