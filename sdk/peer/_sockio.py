"""Socket I/O for the peer protocol: non-blocking sockets, every call bounded by a deadline.

Reads go straight into the caller's buffers (``recv_into``) and writes gather
the caller's buffers (``sendmsg``), so a block is never joined or copied on its
way through.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Iterable

from kvtier.spec import BytesLike, ConnectionClosedError

__all__ = ["recv_blocks", "recv_exact", "send_buffers", "skip", "tune", "wait_io"]

# writev-style calls take at most IOV_MAX buffers (1024 on Linux)
try:
    _IOV_MAX = min(int(os.sysconf("SC_IOV_MAX")), 1024)
except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
    _IOV_MAX = 16


def wait_io(sock: socket.socket, write: bool, deadline: float) -> None:
    """Wait until ``sock`` is readable (or writable); TimeoutError at ``deadline``."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("peer I/O timed out")
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLOUT if write else select.POLLIN)
        # POLLHUP/POLLERR also end the wait: the next call reports the error
        ready = bool(poller.poll(max(1, int(remaining * 1000 + 0.999))))
    else:  # pragma: no cover - Windows
        r, w, _ = select.select([] if write else [sock], [sock] if write else [], [], remaining)
        ready = bool(r or w)
    if not ready:
        raise TimeoutError("peer I/O timed out")


def recv_exact(sock: socket.socket, view: memoryview, deadline: float) -> None:
    """Fill ``view`` from ``sock`` with ``recv_into`` (no intermediate copies)."""
    total = view.nbytes
    got = 0
    while got < total:
        try:
            n = sock.recv_into(view[got:] if got else view, total - got)
        except (BlockingIOError, InterruptedError):
            wait_io(sock, False, deadline)
            continue
        if not n:
            raise ConnectionClosedError(f"connection closed by peer after {got} of {total} bytes",
                                   got)
        got += n


def recv_blocks(
    sock: socket.socket, sizes: list[int], deadline: float
) -> list[bytes | bytearray]:
    """Receive consecutive blocks of ``sizes`` bytes, each into a new object of its own.

    A store keeps a ``bytes`` object as it is and copies anything else, so
    each block is taken with one ``recv(size, MSG_WAITALL)``: the kernel
    fills the new ``bytes`` as the data arrives, whatever the size of the
    receive buffer, and returns once it is whole.  For those calls the
    socket blocks, with ``SO_RCVTIMEO`` keeping each wait within the
    deadline; a block cut short (the timeout, a signal) is finished in
    pieces, into a ``bytearray``.  Receiving a batch into one buffer and
    copying each block out cost ``kvtier serve`` a copy per block; waiting
    with ``SO_RCVLOWAT`` until the socket held a block whole worked only for
    blocks up to a third of the receive buffer (BENCHMARKS.md, "Figures
    behind design choices", has both).
    """
    blocks: list[bytes | bytearray] = []
    sock.setblocking(True)
    try:
        for size in sizes:
            data = _recv_waitall(sock, size, deadline) if size else b""
            if len(data) == size:
                blocks.append(data)
                continue
            sock.setblocking(False)  # the rest comes in pieces, each wait to the deadline
            blocks.append(_recv_rest(sock, data, size, deadline))
            sock.setblocking(True)
    finally:
        _set_recv_timeout(sock, 0.0)
        sock.setblocking(False)
    return blocks


def _recv_waitall(sock: socket.socket, size: int, deadline: float) -> bytes:
    """Up to ``size`` bytes in one blocking ``recv``: all of them unless the wait
    reached the deadline or a signal came; b"" if nothing came in time."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("peer I/O timed out")
    _set_recv_timeout(sock, remaining)
    try:
        data = sock.recv(size, socket.MSG_WAITALL)
    except (BlockingIOError, InterruptedError):  # SO_RCVTIMEO ran out before a byte came
        return b""
    if not data:
        raise ConnectionClosedError(f"connection closed by peer after 0 of {size} bytes", 0)
    return data


def _set_recv_timeout(sock: socket.socket, seconds: float) -> None:
    """``SO_RCVTIMEO`` (0: none); rounded up, so a short wait never becomes no limit."""
    micros = max(1, int(seconds * 1e6) + 1) if seconds > 0 else 0
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                    struct.pack("ll", micros // 1_000_000, micros % 1_000_000))


def _recv_rest(sock: socket.socket, head: bytes, size: int, deadline: float) -> bytearray:
    """A block of ``size`` bytes whose first ``head`` came already, read in pieces."""
    block = bytearray(size)
    block[: len(head)] = head
    recv_exact(sock, memoryview(block)[len(head) :], deadline)
    return block


def skip(sock: socket.socket, count: int, deadline: float) -> None:
    """Read and drop ``count`` bytes, through a bounded scratch buffer."""
    scratch = memoryview(bytearray(min(count, 1 << 20)))
    while count > 0:
        step = min(count, scratch.nbytes)
        recv_exact(sock, scratch[:step], deadline)
        count -= step


#: Bytes handed to one ``sendmsg``: pieces of 1-4 MiB let the receiver get
#: going sooner than one call or smaller pieces (BENCHMARKS.md, "Figures
#: behind design choices").
SEND_PIECE = 2 << 20
#: Buffers taken ahead of the socket while it is full, to use the wait.
_AHEAD = 8 << 20


def send_buffers(sock: socket.socket, buffers: Iterable[BytesLike], deadline: float) -> int:
    """Send ``buffers`` in order with ``sendmsg`` (gather writes, no joining); bytes sent.

    Buffers are taken from ``buffers`` only as they are needed: a lazily
    made one (the header of a :class:`~kvtier.block.framing.Frame`, whose
    checksum pass is made then) is made while the other end takes in the
    bytes before it, and while the socket is full rather than waiting.
    """
    source = iter(buffers)
    pending: deque[memoryview] = deque()  # taken, not yet (wholly) sent
    queued = total = 0
    more = True

    def take() -> None:
        nonlocal more, queued, total
        for buf in source:
            view = memoryview(buf).cast("B")
            if view.nbytes:
                pending.append(view)
                queued += view.nbytes
                total += view.nbytes
                return
        more = False

    while True:
        while more and queued < SEND_PIECE and len(pending) < _IOV_MAX:
            take()
        if not pending:
            return total
        piece: list[memoryview] = []
        room = SEND_PIECE
        for view in pending:
            if room <= 0 or len(piece) == _IOV_MAX:
                break
            piece.append(view if view.nbytes <= room else view[:room])
            room -= view.nbytes
        try:
            sent = sock.sendmsg(piece)
        except (BlockingIOError, InterruptedError):
            if more and queued < _AHEAD and len(pending) < _IOV_MAX:
                take()  # the socket is full: make the next buffer meanwhile
            else:
                wait_io(sock, True, deadline)
            continue
        queued -= sent
        while sent:
            head = pending[0]
            if sent >= head.nbytes:
                sent -= head.nbytes
                pending.popleft()
            else:
                pending[0] = head[sent:]
                sent = 0
        if time.monotonic() > deadline and (pending or more):
            raise TimeoutError("peer I/O timed out")


def tune(sock: socket.socket, buffer_size: int = 4 << 20) -> None:
    """Low latency, large kernel buffers, non-blocking (every wait has a deadline)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):  # capped or refused: the kernel default will do
            sock.setsockopt(socket.SOL_SOCKET, option, buffer_size)
    sock.setblocking(False)
