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


#: How long a block taken whole may keep the reader waiting for its last bytes
#: before the rest of the request is read in pieces (a receive window smaller
#: than the block would otherwise never let it arrive whole).
WHOLE_WAIT = 0.25


def recv_blocks(
    sock: socket.socket, sizes: list[int], deadline: float
) -> list[bytes | bytearray]:
    """Receive consecutive blocks of ``sizes`` bytes, each into a new object of its own.

    A store keeps a ``bytes`` object as it is and copies anything else, so
    each block is taken with one ``recv`` of its whole size into a new
    ``bytes`` once the socket holds all of it: ``SO_RCVLOWAT`` makes poll
    wait for that.  Receiving a batch into one buffer and copying each block
    out of it cost ``kvtier serve`` a copy per block (16 x 2 MiB puts at
    0.50x of a plain socket).  The sender can only get as much in flight as
    the receive window, about half the receive buffer, so only blocks of up
    to a third of the buffer are waited for whole; larger ones, and every
    block after one that did not arrive whole within :data:`WHOLE_WAIT`,
    arrive in pieces, into a ``bytearray``.
    """
    whole_max = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 3
    blocks: list[bytes | bytearray] = []
    lowat = 1
    try:
        for size in sizes:
            data, tried = b"", False
            if 0 < size <= whole_max:
                if lowat != size:
                    lowat = size if _set_lowat(sock, size) else 1
                if lowat == size:
                    data, tried = _recv_whole(sock, size, deadline), True
            if len(data) == size:
                blocks.append(data)
                continue
            if tried:  # it did not come whole in time: nor will the rest
                whole_max = 0
            if lowat != 1:  # pieces must not wait for a mark they may never reach
                lowat = 1 if _set_lowat(sock, 1) else lowat
            blocks.append(_recv_rest(sock, data, size, deadline))
    finally:
        if lowat != 1:
            _set_lowat(sock, 1)  # the next frame head is read as it comes
    return blocks


def _set_lowat(sock: socket.socket, size: int) -> bool:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, size)
    except OSError:
        return False
    return True


def _recv_whole(sock: socket.socket, size: int, deadline: float) -> bytes:
    """The block in one ``recv`` once the socket holds all of it; what has come
    (possibly nothing) if it has not within :data:`WHOLE_WAIT`."""
    try:
        # poll first: it waits for the low-water mark, a non-blocking recv does not
        wait_io(sock, False, min(deadline, time.monotonic() + WHOLE_WAIT))
    except TimeoutError:
        if time.monotonic() >= deadline:
            raise
    try:
        data = sock.recv(size)
    except (BlockingIOError, InterruptedError):
        return b""
    if not data:
        raise ConnectionClosedError(f"connection closed by peer after 0 of {size} bytes", 0)
    return data


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


#: Bytes handed to one ``sendmsg``.  A 32 MiB batch sent in calls of 1-4 MiB
#: took 8.1-8.6 ms over loopback, in one call 10.1-10.9 ms (2-core VM, median
#: of 25; the receiver gets going sooner), in 256 KiB calls 10.3 ms.
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
