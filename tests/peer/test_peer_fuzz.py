"""Fuzzing the peer protocol: the decoder only ever raises ProtocolError, within bounded memory,
and a live server drops a connection that sends garbage while serving everyone else."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from peer_server import PeerServer

from kvtier import Namespace, open_chain
from kvtier.backends.peer import PeerBackend
from kvtier.peer import protocol as pp
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import ConnectionClosedError, ProtocolError

NS = Namespace("fuzz-model")
#: What decoding one frame may allocate beyond its input: the header limit, with room
#: for the Python objects a 64 KiB msgpack header can expand to.
MEMORY_BOUND = 8 << 20

keys = st.binary(min_size=1, max_size=64)
key_lists = st.lists(keys, max_size=20)


@st.composite
def valid_frames(draw: st.DrawFn) -> bytes:
    """A well-formed frame of any message type, payload included."""
    kind = draw(st.sampled_from(["hello", "welcome", "auth", "error", "get", "put", "lookup",
                                 "stats", "keep", "expire", "deadlines", "reply_sizes",
                                 "reply_flags", "reply_marks", "reply_left"]))
    rid = draw(st.integers(0, 1 << 40))
    payload = b""
    header: dict[str, Any]
    if kind == "hello":
        header = {"t": pp.HELLO, "v": 1, "ns": NS.hex, "n": draw(st.binary(min_size=32,
                  max_size=32)), "a": draw(st.booleans()), "mp": 1 << 20}
    elif kind == "welcome":
        header = {"t": pp.WELCOME, "v": 1, "n": bytes(32), "a": draw(st.booleans()),
                  "mp": 1 << 20}
        if draw(st.booleans()):  # the optional requests (a server of before sends none)
            header["x"] = draw(st.lists(st.integers(0, 255), max_size=4))
    elif kind == "auth":
        header = {"t": draw(st.sampled_from([pp.AUTH, pp.AUTH_OK])), "mac": bytes(32)}
    elif kind == "error":
        header = {"t": pp.ERROR, "id": rid, "c": "x", "m": draw(st.text(max_size=50))}
    elif kind in ("get", "lookup"):
        header = {"t": pp.GET if kind == "get" else pp.LOOKUP, "id": rid, "k": draw(key_lists)}
    elif kind == "put":
        ks = draw(key_lists)
        blobs = [draw(st.binary(max_size=40)) for _ in ks]
        header = {"t": pp.PUT, "id": rid, "k": ks, "s": [len(b) for b in blobs]}
        payload = b"".join(blobs)
    elif kind == "stats":
        header = {"t": pp.STATS, "id": rid}
    elif kind == "keep":
        header = {"t": draw(st.sampled_from([pp.KEEP, pp.RELEASE])), "id": rid,
                  "k": draw(key_lists)}
    elif kind == "expire":
        header = {"t": pp.EXPIRE, "id": rid, "k": draw(key_lists),
                  "d": draw(st.floats(min_value=1e-6, max_value=1e12))}
    elif kind == "deadlines":
        header = {"t": pp.DEADLINES, "id": rid, "k": draw(key_lists)}
    elif kind == "reply_left":
        header = {"t": pp.REPLY, "id": rid, "l": draw(st.lists(st.one_of(
            st.none(), st.floats(min_value=1e-6, max_value=1e12),
            st.integers(1, 1 << 40)), max_size=10))}
    elif kind == "reply_marks":
        header = {"t": pp.REPLY, "id": rid,
                  "o": draw(st.lists(st.one_of(st.none(), st.booleans()), max_size=10))}
    elif kind == "reply_sizes":
        blobs = draw(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=10))
        header = {"t": pp.REPLY, "id": rid, "s": [None if b is None else len(b) for b in blobs]}
        payload = b"".join(b for b in blobs if b is not None)
    else:
        header = {"t": pp.REPLY, "id": rid, "r": draw(st.lists(st.booleans(), max_size=10))}
    return pp.frame(header, len(payload)) + payload


weird_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1), st.floats(),
    st.text(max_size=40), st.binary(max_size=80),
    st.lists(st.one_of(st.integers(-2, 2), st.binary(max_size=70), st.none()), max_size=8),
    st.dictionaries(st.text(max_size=3), st.integers(-(1 << 63), (1 << 63) - 1), max_size=3),
)


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    """A valid frame broken one way: flipped bytes, truncation, lengths, field types."""
    data = bytearray(draw(valid_frames()))
    how = draw(st.sampled_from(["flip", "truncate", "extend", "lengths", "field"]))
    if how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
    elif how == "truncate":
        del data[draw(st.integers(0, len(data) - 1)):]
    elif how == "extend":
        data += draw(st.binary(min_size=1, max_size=20))
    elif how == "lengths":
        header_len = draw(st.sampled_from([0, 1, pp.MAX_HEADER + 1, pp.MAX_U32]))
        payload_len = draw(st.sampled_from([0, 1, 1 << 31, pp.MAX_U32]))
        data[4:12] = struct.pack("<II", header_len, payload_len)
    else:
        header, payload = pp.decode_frame(bytes(data))
        name = draw(st.sampled_from([*sorted(header), "t", "id", "k", "s", "v", "d", "l"]))
        header[name] = draw(weird_values)
        return pp.frame(header, len(payload)) + bytes(payload)
    return bytes(data)


def decode_all(data: bytes) -> None:
    """Everything a server or client does with bytes off the wire, short of I/O."""
    header, payload = pp.decode_frame(data, 1 << 20)
    pp.parse_message(header, payload.nbytes)


def only_protocol_errors(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_all(data)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_protocol_errors(data: bytes) -> None:
    only_protocol_errors(data)
    only_protocol_errors(pp.MAGIC + data)  # past the magic, into the lengths and header


@settings(max_examples=1000, deadline=None)
@given(mutated_frames())
def test_mutated_frames_raise_only_protocol_errors(data: bytes) -> None:
    only_protocol_errors(data)


@settings(max_examples=200, deadline=None)
@given(valid_frames())
def test_valid_frames_decode(data: bytes) -> None:
    decode_all(data)


def test_a_welcome_names_the_optional_requests_it_answers() -> None:
    """A server of before KEEP sends no ``x``; types a client does not know are dropped."""
    base = {"t": pp.WELCOME, "v": 1, "n": bytes(32), "a": False, "mp": 1 << 20}
    old = pp.parse_message(base, 0)
    assert isinstance(old, pp.Welcome) and old.extras == frozenset()
    new = pp.parse_message({**base, "x": [pp.KEEP, pp.RELEASE, 200]}, 0)
    assert isinstance(new, pp.Welcome) and new.extras == {pp.KEEP, pp.RELEASE}
    with pytest.raises(ProtocolError):
        pp.parse_message({**base, "x": ["KEEP"]}, 0)
    reply = pp.parse_message({"t": pp.REPLY, "id": 3, "o": [True, None, False]}, 0)
    assert reply == pp.Reply(3, None, None, [True, None, False])
    with pytest.raises(ProtocolError):
        pp.parse_message({"t": pp.REPLY, "id": 3, "o": [1]}, 0)


@pytest.mark.parametrize("after", [0, 0.0, -1.5, float("nan"), float("inf"), True, "10m", None])
def test_an_expire_without_a_time_above_0_is_a_protocol_error(after: Any) -> None:
    """The deadline is finite seconds above 0: anything else is a bad frame, as the
    chain's ``expire`` would refuse it (a ``ValueError`` there)."""
    with pytest.raises(ProtocolError, match="'d'"):
        pp.parse_message({"t": pp.EXPIRE, "id": 1, "k": [b"k"], "d": after}, 0)
    with pytest.raises(ProtocolError, match="'d'"):
        pp.parse_message({"t": pp.EXPIRE, "id": 1, "k": [b"k"]}, 0)
    good = pp.parse_message({"t": pp.EXPIRE, "id": 1, "k": [b"k"], "d": 2}, 0)
    assert good == pp.Request(pp.EXPIRE, 1, [b"k"], [], 2.0)
    with pytest.raises(ProtocolError):  # no payload
        pp.parse_message({"t": pp.EXPIRE, "id": 1, "k": [b"k"], "d": 2.5}, 3)


@pytest.mark.parametrize("left", [0, 0.0, -1.5, float("nan"), float("inf"), True, "10m", b"1"])
def test_a_deadlines_reply_of_anything_but_seconds_above_0_is_a_protocol_error(
        left: Any) -> None:
    """Per key finite seconds above 0, or nil: anything else is a bad frame, as
    ``BackendHandle.deadlines`` would refuse it from a backend."""
    with pytest.raises(ProtocolError, match="deadlines"):
        pp.parse_message({"t": pp.REPLY, "id": 3, "l": [1.5, left]}, 0)
    with pytest.raises(ProtocolError):
        pp.parse_message({"t": pp.REPLY, "id": 3, "l": 1.5}, 0)
    good = pp.parse_message({"t": pp.REPLY, "id": 3, "l": [1.5, None, 2]}, 0)
    assert good == pp.Reply(3, None, None, None, [1.5, None, 2.0])
    with pytest.raises(ProtocolError):  # no payload
        pp.parse_message({"t": pp.REPLY, "id": 3, "l": [1.5]}, 4)
    request = pp.parse_message({"t": pp.DEADLINES, "id": 1, "k": [b"k"]}, 0)
    assert request == pp.Request(pp.DEADLINES, 1, [b"k"], [])


class BytesSocket:
    """Enough of a socket for FrameReader: recv_into from a fixed byte string, then EOF."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)

    def recv_into(self, view: memoryview, size: int = 0) -> int:
        n = min(size or view.nbytes, self.data.nbytes)
        view[:n] = self.data[:n]
        self.data = self.data[n:]
        return n


def read_frame(data: bytes) -> None:
    """A server's read of one request frame, payload included."""
    sock: Any = BytesSocket(data)
    deadline = time.monotonic() + 5
    header, payload_len = pp.FrameReader().read_head(sock, deadline, 1 << 20)
    pp.parse_message(header, payload_len)
    pp.recv_exact(sock, memoryview(bytearray(payload_len)), deadline)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated_frames(), st.binary(max_size=200)))
def test_stream_reader_bounded_and_typed(data: bytes) -> None:
    tracemalloc.start()
    try:
        read_frame(data)
    except (ProtocolError, ConnectionClosedError):
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < MEMORY_BOUND


@pytest.mark.parametrize("declared", [1 << 31, pp.MAX_U32])
def test_a_declared_4gib_payload_is_refused_before_any_allocation(declared: int) -> None:
    head = pp.frame({"t": pp.PUT, "id": 1, "k": [b"k"], "s": [declared]}, declared)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="exceeds the limit"):
            read_frame(head)
        with pytest.raises(ProtocolError, match="exceeds the limit"):
            pp.decode_frame(head)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_header_at_the_limit_decodes_and_one_beyond_is_refused() -> None:
    keys_at_limit = [bytes([i % 256]) * 64 for i in range(4096)]
    with pytest.raises(ProtocolError, match="exceeds"):
        pp.frame({"t": pp.LOOKUP, "id": 1, "k": keys_at_limit})  # 4096 x 64 B > 64 KiB
    big: dict[str, Any] = {"t": pp.LOOKUP, "id": 1, "k": [b"k" * 8] * 4096}
    assert pp.parse_message(*_decoded(pp.frame(big))) == pp.Request(pp.LOOKUP, 1, big["k"], [])
    too_many = {"t": pp.LOOKUP, "id": 1, "k": [b"k"] * 4097}
    with pytest.raises(ProtocolError):
        decode_all(pp.frame(too_many))
    long_key = {"t": pp.LOOKUP, "id": 1, "k": [b"k" * 65]}
    with pytest.raises(ProtocolError):
        decode_all(pp.frame(long_key))


def _decoded(data: bytes) -> tuple[dict[str, Any], int]:
    header, payload = pp.decode_frame(data)
    return header, payload.nbytes


# --- against a live server -------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerServer]:
    with PeerServer(tmp_path_factory.mktemp("fuzz-node")) as server:
        yield server


@pytest.fixture(scope="module")
def good_client(live: PeerServer) -> Iterator[Any]:
    registry = BackendRegistry()
    registry.register("peer", PeerBackend)
    cfg = {"chain": [{"name": "p", "backend": "peer", "peers": [live.address]}]}
    with open_chain(cfg, namespace=NS, registry=registry) as chain:
        assert chain.put([b"canary"], [b"still here"]) == [True]
        yield chain


def send_and_expect_close(server: PeerServer, data: bytes, handshake: bool) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        pp.tune(sock)
        deadline = time.monotonic() + 10
        if handshake:
            pp.client_handshake(sock, namespace=NS.hex, secret=None, max_payload=1 << 20,
                                label=server.address, deadline=deadline)
        try:
            pp.send_buffers(sock, [data], deadline)
            sock.shutdown(socket.SHUT_WR)  # a frame promising more then gets EOF mid-frame
        except OSError:
            return  # already closed by the server
        scratch = memoryview(bytearray(1 << 16))
        while True:  # the server may answer (an ERROR, a reply) but must then close
            try:
                if not sock.recv_into(scratch):
                    return
            except (BlockingIOError, InterruptedError):
                pp.wait_io(sock, False, deadline)
            except ConnectionResetError:
                return


def canary_alive(chain: Any) -> bool:
    out = bytearray(10)
    return chain.get([b"canary"], [out]) == [True] and bytes(out) == b"still here"


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.one_of(mutated_frames(), st.binary(min_size=1, max_size=200)),
       handshake=st.booleans())
def test_live_server_drops_garbage_and_keeps_serving(
    live: PeerServer, good_client: Any, data: bytes, handshake: bool
) -> None:
    send_and_expect_close(live, data, handshake)
    assert live.running()
    assert canary_alive(good_client)


def test_live_server_counts_protocol_errors(live: PeerServer, good_client: Any) -> None:
    send_and_expect_close(live, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", handshake=False)
    huge = pp.frame({"t": pp.PUT, "id": 1, "k": [b"k"], "s": [pp.MAX_U32]}, pp.MAX_U32)
    send_and_expect_close(live, huge, handshake=True)
    assert canary_alive(good_client)
    backend = good_client.tiers[0].handle.instance
    (stats,) = backend.server_stats().values()
    assert stats["server"]["protocol_errors"] >= 2
    assert "protocol error" in live.log() and "127.0.0.1:" in live.log()
