"""The peer protocol's block receive: each block of a put whole in an object of its own."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from kvtier.peer import _sockio
from kvtier.peer import protocol as pp
from kvtier.spec import ConnectionClosedError

SIZES = [0, 1, 4096, 2 << 20, (3 << 20) + 7, 100]


def blocks_of(sizes: list[int]) -> list[bytes]:
    rng = random.Random(sum(sizes))
    return [rng.randbytes(n) for n in sizes]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A loopback TCP connection: (sender, receiver), the receiver tuned as a server's is."""
    server = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(server.getsockname())
    receiver, _ = server.accept()
    server.close()
    pp.tune(receiver)
    yield sender, receiver
    sender.close()
    receiver.close()


def send_slowly(sock: socket.socket, data: bytes) -> threading.Thread:
    """Send ``data`` in uneven pieces with pauses, so blocks arrive in parts."""

    def run() -> None:
        rng = random.Random(7)
        view = memoryview(data)
        while view.nbytes:
            n = min(view.nbytes, rng.choice([1000, 65536, 700_000]))
            sock.sendall(view[:n])
            view = view[n:]
            time.sleep(0.001)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def socket_restored(sock: socket.socket) -> bool:
    """Non-blocking again and without a receive timeout, as the rest of the server expects."""
    timeout = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)
    return sock.getblocking() is False and timeout == bytes(16)


def test_blocks_arrive_whole_and_exact(pair: tuple[socket.socket, socket.socket]) -> None:
    sender, receiver = pair
    blocks = blocks_of(SIZES)
    thread = send_slowly(sender, b"".join(blocks))
    got = pp.recv_blocks(receiver, SIZES, time.monotonic() + 30)
    thread.join()
    assert [bytes(b) for b in got] == blocks
    assert all(type(block) is bytes for block in got)  # each taken whole: no copy to keep it
    assert socket_restored(receiver)


def test_blocks_larger_than_the_buffer_still_arrive_whole() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(server.getsockname())
    receiver, _ = server.accept()
    server.close()
    try:
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        receiver.setblocking(False)
        sizes = [8 << 20, 1 << 20, 300_000]
        blocks = blocks_of(sizes)
        thread = send_slowly(sender, b"".join(blocks))
        got = pp.recv_blocks(receiver, sizes, time.monotonic() + 30)
        thread.join()
        assert [bytes(b) for b in got] == blocks
        assert all(type(block) is bytes for block in got)
        assert socket_restored(receiver)
    finally:
        sender.close()
        receiver.close()


def test_a_connection_closed_mid_block_is_an_error(
    pair: tuple[socket.socket, socket.socket]
) -> None:
    sender, receiver = pair
    sender.sendall(b"x" * 5000)
    sender.close()
    with pytest.raises(ConnectionClosedError):
        pp.recv_blocks(receiver, [10_000], time.monotonic() + 10)
    assert socket_restored(receiver)


def test_a_block_held_up_mid_way_waits_for_the_rest_until_the_deadline(
    pair: tuple[socket.socket, socket.socket]
) -> None:
    sender, receiver = pair
    sizes = [1 << 20, 4096]
    blocks = blocks_of(sizes)
    data = b"".join(blocks)

    def send() -> None:
        sender.sendall(data[: 1 << 19])  # half the first block, then a pause
        time.sleep(0.5)
        sender.sendall(data[1 << 19 :])

    thread = threading.Thread(target=send)
    thread.start()
    got = pp.recv_blocks(receiver, sizes, time.monotonic() + 30)
    thread.join()
    assert [bytes(b) for b in got] == blocks
    assert all(type(block) is bytes for block in got)
    # held up past the deadline, it is a timeout, not a hang
    sender.sendall(b"y" * 1000)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        pp.recv_blocks(receiver, [10_000], started + 0.3)
    assert 0.25 < time.monotonic() - started < 5
    assert socket_restored(receiver)


def test_a_block_cut_short_by_a_signal_is_finished_in_pieces(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    # recv(MSG_WAITALL) may return early (a signal, the timeout): the rest comes in pieces
    sender, receiver = pair
    sizes = [1 << 20, 4096]
    blocks = blocks_of(sizes)
    sender.sendall(b"".join(blocks))
    real = _sockio._recv_waitall
    calls: list[int] = []

    def short_first(sock: socket.socket, size: int, deadline: float) -> bytes:
        calls.append(size)
        return real(sock, 1000, deadline) if len(calls) == 1 else real(sock, size, deadline)

    monkeypatch.setattr(_sockio, "_recv_waitall", short_first)
    got = pp.recv_blocks(receiver, sizes, time.monotonic() + 30)
    assert [bytes(b) for b in got] == blocks
    assert type(got[0]) is bytearray and type(got[1]) is bytes
    assert socket_restored(receiver)


# sends ---------------------------------------------------------------------------------


def test_buffers_go_out_in_order_and_exact(pair: tuple[socket.socket, socket.socket]) -> None:
    sender, receiver = pair
    pp.tune(sender)  # non-blocking, as the client's and the server's are
    buffers = blocks_of([*SIZES, 0, 5 << 20, 3])
    total = sum(len(b) for b in buffers)
    got = bytearray()

    def drain() -> None:
        receiver.setblocking(True)
        while len(got) < total:
            got.extend(receiver.recv(1 << 20))

    thread = threading.Thread(target=drain)
    thread.start()
    assert pp.send_buffers(sender, iter(buffers), time.monotonic() + 30) == total
    thread.join()
    assert bytes(got) == b"".join(buffers)


class _FullSocket:
    """Takes at most ``take`` bytes per sendmsg, and every other call none (full)."""

    def __init__(self, events: list[str], take: int) -> None:
        self.events, self.take, self.calls = events, take, 0
        self.data = bytearray()

    def sendmsg(self, views: list[memoryview]) -> int:
        self.calls += 1
        assert sum(v.nbytes for v in views) <= _sockio.SEND_PIECE
        if self.calls % 2 == 0:
            raise BlockingIOError
        sent = 0
        for view in views:
            n = min(view.nbytes, self.take - sent)
            self.data += view[:n]
            sent += n
        self.events.append(f"sent {sent}")
        return sent


def test_buffers_are_taken_as_the_socket_takes_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # A lazily made buffer (a frame's header and its checksum) is made while
    # the other end takes in what went before, not all before the first send.
    monkeypatch.setattr(_sockio, "wait_io", lambda sock, write, deadline: None)
    events: list[str] = []
    buffers = blocks_of([3 << 20] * 6)

    def lazily() -> Iterator[bytes]:
        for i, buf in enumerate(buffers):
            events.append(f"take {i}")
            yield buf

    sock = _FullSocket(events, take=1 << 20)
    sent = pp.send_buffers(sock, lazily(), time.monotonic() + 30)  # type: ignore[arg-type]
    assert sent == len(sock.data) == 18 << 20
    assert bytes(sock.data) == b"".join(buffers)
    first_send = events.index(next(e for e in events if e.startswith("sent")))
    assert first_send < events.index("take 1")
    # taken ahead while the socket was full, but never more than _AHEAD bytes
    took = [events.index(f"take {i}") for i in range(6)]
    for i, at in enumerate(took):
        sent_before = sum(int(e.split()[1]) for e in events[:at] if e.startswith("sent"))
        assert i * (3 << 20) - sent_before <= _sockio._AHEAD
