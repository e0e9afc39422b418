"""``object``'s socket reads against a real SeaweedFS: GET bodies received straight into
the caller's buffers on kept-alive connections, and every answer they do not expect
read again by obstore (backends/object/socket_reads.py).

The faults come from a loopback proxy in front of the server (``tcp_proxy.py``): a
response cut inside its body, connections closed between reads.  The blocks are
stored through the server itself, so the proxy sees only the reads.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from seaweed import SeaweedServer, object_options
from tcp_proxy import TcpProxy

from kvtier.backends.object.socket_reads import SocketReads
from kvtier.plugins.registry import BackendHandle, BackendRegistry
from kvtier.spec import BackendError

NS = "0123456789abcdef0123456789abcdef"
MIB = 1 << 20


def blob(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def socket_stats(handle: BackendHandle) -> dict[str, int]:
    stats = handle.stats()
    return {k: int(stats[k]) for k in ("socket_reads", "socket_fallbacks")}


@pytest.fixture
def proxy(s3_server: SeaweedServer) -> Iterator[TcpProxy]:
    where = urlsplit(s3_server.endpoint)
    assert where.hostname is not None and where.port is not None
    with TcpProxy((where.hostname, where.port)) as tcp:
        yield tcp


@pytest.fixture
def writer(s3_server: SeaweedServer, bucket: str) -> Iterator[BackendHandle]:
    """Stores the blocks, straight to the server."""
    handle = BackendRegistry().create("object")
    handle.open(object_options(s3_server, bucket, prefix="socket-reads"), NS)
    yield handle
    handle.close()


@pytest.fixture
def reader(s3_server: SeaweedServer, bucket: str, proxy: TcpProxy,
           writer: BackendHandle) -> Iterator[BackendHandle]:
    """Reads them through the proxy: one thread, so one kept-alive connection; no
    lookup index, so no LIST of its own beside the reads."""
    handle = BackendRegistry().create("object")
    handle.open(object_options(s3_server, bucket, prefix="socket-reads", endpoint=proxy.endpoint,
                               concurrency=1, lookup_cache_ttl=0), NS)
    yield handle
    handle.close()


def test_bodies_land_in_the_buffers_byte_for_byte_on_one_kept_alive_connection(
    writer: BackendHandle, reader: BackendHandle, proxy: TcpProxy
) -> None:
    keys = [b"sock-%d" % i for i in range(4)]
    blocks = [blob(2 * MIB + i, i) for i in range(4)]
    assert writer.put(keys, blocks, []) == [True] * 4
    outs = [bytearray(len(b)) for b in blocks]
    scatter = []
    for out in outs:  # split at odd places: the header's first receive straddles buffers
        view = memoryview(out)
        scatter.append([view[:3], view[3:4099], view[4099:MIB + 1], view[MIB + 1:]])
    before = proxy.connections
    assert reader.get_into(keys, scatter) == [len(b) for b in blocks]
    assert [bytes(o) for o in outs] == blocks
    assert socket_stats(reader) == {"socket_reads": 4, "socket_fallbacks": 0}
    assert proxy.connections - before == 1  # one connection, kept alive across the reads


def test_a_missing_object_is_a_miss_and_keeps_the_connection(
    writer: BackendHandle, reader: BackendHandle, proxy: TcpProxy
) -> None:
    block = blob(MIB, 7)
    assert writer.put([b"here"], [block], []) == [True]
    out, spare = bytearray(MIB), bytearray(b"\x5a" * MIB)
    before = proxy.connections
    assert reader.get_into([b"gone", b"here"], [[memoryview(spare)], [memoryview(out)]]) == [
        None, MIB]
    assert bytes(out) == block
    assert spare == b"\x5a" * MIB  # a miss leaves the caller's buffer as it was
    assert socket_stats(reader) == {"socket_reads": 2, "socket_fallbacks": 0}
    assert proxy.connections - before == 1


def test_an_object_of_another_size_answers_its_size_and_the_next_read_goes_on(
    writer: BackendHandle, reader: BackendHandle
) -> None:
    blocks = [blob(2 * MIB, 1), blob(MIB, 2)]
    assert writer.put([b"long", b"next"], blocks, []) == [True, True]
    short, out = bytearray(MIB), bytearray(MIB)
    assert reader.get_into([b"long", b"next"], [[memoryview(short)], [memoryview(out)]]) == [
        2 * MIB, MIB]
    assert bytes(out) == blocks[1]
    assert socket_stats(reader)["socket_fallbacks"] == 0


def test_a_response_cut_inside_its_body_is_read_again_by_obstore(
    writer: BackendHandle, reader: BackendHandle, proxy: TcpProxy
) -> None:
    block = blob(2 * MIB, 3)
    assert writer.put([b"cut"], [block], []) == [True]
    proxy.cut_next(1, after=MIB)  # the socket's response stops a MiB in; obstore's is whole
    out = bytearray(2 * MIB)
    assert reader.get_into([b"cut"], [[memoryview(out)]]) == [2 * MIB]
    assert bytes(out) == block
    assert socket_stats(reader) == {"socket_reads": 0, "socket_fallbacks": 1}


def test_responses_cut_on_every_connection_are_read_whole_by_obstore_or_are_a_fault(
    writer: BackendHandle, reader: BackendHandle, proxy: TcpProxy
) -> None:
    block = blob(2 * MIB, 4)
    assert writer.put([b"always-cut"], [block], []) == [True]
    # every connection, obstore's included, ends a MiB into the body: obstore asks for
    # the rest by range on a new one, so the block still arrives whole
    proxy.cut_all(after=MIB)
    out = bytearray(2 * MIB)
    assert reader.get_into([b"always-cut"], [[memoryview(out)]]) == [2 * MIB]
    assert bytes(out) == block
    # ended inside the response header: no try gets a body, the read is a fault
    proxy.cut_all(after=100)
    with pytest.raises(BackendError):
        reader.get_into([b"always-cut"], [[memoryview(bytearray(2 * MIB))]])
    assert socket_stats(reader) == {"socket_reads": 0, "socket_fallbacks": 2}


def test_a_kept_alive_connection_the_server_closed_is_opened_again(
    writer: BackendHandle, reader: BackendHandle, proxy: TcpProxy
) -> None:
    blocks = [blob(MIB, 5), blob(MIB, 6)]
    assert writer.put([b"one", b"two"], blocks, []) == [True, True]
    outs = [bytearray(MIB), bytearray(MIB)]
    assert reader.get_into([b"one"], [[memoryview(outs[0])]]) == [MIB]
    proxy.close_all()  # an idle timeout, a restart: the reader's socket is dead
    assert reader.get_into([b"two"], [[memoryview(outs[1])]]) == [MIB]
    assert [bytes(o) for o in outs] == blocks
    assert socket_stats(reader) == {"socket_reads": 2, "socket_fallbacks": 0}


def test_a_stalled_response_is_a_fault_within_the_request_timeout(
    s3_server: SeaweedServer, bucket: str, writer: BackendHandle, proxy: TcpProxy
) -> None:
    assert writer.put([b"stalled"], [blob(MIB, 9)], []) == [True]
    handle = BackendRegistry().create("object")
    handle.open(object_options(s3_server, bucket, prefix="socket-reads", endpoint=proxy.endpoint,
                               concurrency=1, lookup_cache_ttl=0, timeout="1s"), NS)
    try:
        proxy.stalled.set()
        with pytest.raises(BackendError, match="no answer within 1 s"):
            handle.get_into([b"stalled"], [[memoryview(bytearray(MIB))]])
        # not handed to obstore: its GET would have waited on the same server
        assert socket_stats(handle) == {"socket_reads": 0, "socket_fallbacks": 0}
    finally:
        proxy.stalled.clear()
        handle.close()


def test_socket_reads_off_or_over_https_leave_every_request_to_obstore(
    s3_server: SeaweedServer, bucket: str, writer: BackendHandle
) -> None:
    block = blob(MIB, 8)
    assert writer.put([b"plain"], [block], []) == [True]
    handle = BackendRegistry().create("object")
    handle.open(object_options(s3_server, bucket, prefix="socket-reads", socket_reads=False), NS)
    try:
        out = bytearray(MIB)
        assert handle.get_into([b"plain"], [[memoryview(out)]]) == [MIB]
        assert bytes(out) == block
        assert "socket_reads" not in handle.stats()
    finally:
        handle.close()
    over_https = {"endpoint": "https://127.0.0.1:1", "socket_reads": True,
                  "request_timeout": 1.0, "connect_timeout": 1.0}
    assert SocketReads.for_options(None, over_https) is None  # type: ignore[arg-type]
