"""The writers the crash-safety group kills: ``python -m kvtier.testing.crash_child CONFIG``.

``CONFIG`` is a JSON object: ``backend`` (name or import path), ``options``
(as the test's ``backend_options`` gave them), ``namespace``, ``limit``
(largest block size) and ``mode``.

``mode: "stream"`` (with ``prefix`` and ``max_bytes``) opens the backend
exactly as the test did and puts :func:`~kvtier.testing.data.crash_key`
blocks in small batches, printing ``begin FIRST LAST`` before each put and
``done LAST`` after it, flushed, so the parent knows which keys may exist.
It never closes the backend: the parent kills it with SIGKILL at an instant
of its choosing.

``mode: "steps"`` serves the parent one writer per line of stdin, each a JSON
object ``{"prefix": ..., "kill_at": N}``: it forks (so a writer starts in
milliseconds, with kvtier already imported), and the fork opens the backend
and puts the batches of :func:`~kvtier.testing.data.crash_plan`, counting
the I/O calls the backend makes during each put (:data:`IO_CALLS`, seen
through :func:`sys.setprofile` in every thread).  Just before call number
``kill_at`` it kills itself with SIGKILL; a writer that gets through the plan
prints ``events N`` and kills itself then.  It prints ``begin I`` and
``done I COUNT`` around put ``I`` (``COUNT``: calls so far), and the server
answers ``exit STATUS`` once the fork is gone.  The same ``kill_at`` always
stops a single-threaded backend at the same step, so a kill point that finds
a torn block finds it on every run.
"""

from __future__ import annotations

import collections
import io
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import types
from collections.abc import Mapping
from types import FrameType
from typing import Any

from kvtier.plugins.registry import BackendHandle
from kvtier.spec import BytesLike

from .data import block_for, crash_key, crash_plan, crash_size
from .resolve import resolve_backend, validate_options

__all__ = ["IO_CALLS", "NOT_IO", "main"]

#: A child whose parent died without killing it stops on its own.
_DEADLINE = time.monotonic() + 600.0

#: Names of the C-level calls a put is cut between: what writes, moves or
#: publishes bytes (files, sockets, SQLite).  A backend in pure Python reaches
#: its storage only through such calls, so a kill before each one stops it
#: between any two of its steps.
IO_CALLS = frozenset(
    {
        "open", "write", "writev", "pwrite", "pwritev", "writelines", "flush", "fsync",
        "fdatasync", "close", "__exit__", "rename", "replace", "link", "symlink", "unlink",
        "remove", "mkdir", "truncate", "ftruncate", "send", "sendall", "sendmsg", "sendto",
        "sendfile", "copy_file_range", "execute", "executemany", "executescript", "commit",
    }
)  # fmt: skip

#: Values whose methods share a name with an I/O call (``str.replace``,
#: ``list.remove``, ``deque.remove`` inside :mod:`threading`, a generator's
#: ``send`` and ``close``): no byte reaches storage through them, and a kill
#: before one stops the writer where a kill before the next I/O call does, so
#: they are not numbered.  Numbered, they made a put through an HTTP client
#: look like a hundred steps (botocore builds each request with dozens of
#: ``str.replace``), and a store whose I/O is all native (obstore) look like
#: one with two steps to cut between, both of them a lock's bookkeeping.
NOT_IO = (
    str, bytes, bytearray, list, set, frozenset, dict, tuple, collections.deque,
    types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType,
)  # fmt: skip


def _open(config: Mapping[str, Any]) -> BackendHandle:
    registry, name = resolve_backend(config["backend"])
    options = validate_options(config["backend"], config["options"])
    handle = registry.create(name)
    handle.open(options, config["namespace"])
    return handle


def _wait_for_kill() -> int:
    while time.monotonic() < _DEADLINE:  # wait for the parent's SIGKILL
        time.sleep(0.05)
    return 3


def stream(config: Mapping[str, Any]) -> int:
    """Put blocks in batches of one to three until killed (or ``max_bytes`` are written)."""
    handle = _open(config)
    prefix, limit = str(config["prefix"]), int(config["limit"])
    print("open", flush=True)
    index = written = batch = 0
    while written < int(config["max_bytes"]):
        count = 1 + batch % 3  # batches of one to three blocks
        keys = [crash_key(prefix, i) for i in range(index, index + count)]
        # built before "begin" so the time between the lines is the put alone
        blocks: list[BytesLike] = [
            block_for(k, crash_size(i, limit)) for i, k in zip(range(index, index + count), keys)
        ]
        print(f"begin {index} {index + count - 1}", flush=True)
        evicted: list[tuple[bytes, BytesLike]] = []
        handle.put(keys, blocks, evicted)
        print(f"done {index + count - 1}", flush=True)
        written += sum(len(b) for b in blocks)
        index += count
        batch += 1
    print("idle", flush=True)
    return _wait_for_kill()


class _Cutter:
    """A profile function that numbers the I/O calls of a put and dies before one of them."""

    def __init__(self, kill_at: int | None) -> None:
        self.kill_at = kill_at
        self.armed = False
        self._numbers = itertools.count()  # next() is atomic under the GIL
        self.count = 0

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "c_call" or not self.armed:
            return
        name = getattr(arg, "__name__", "")
        if name not in IO_CALLS:
            return
        owner = getattr(arg, "__self__", None)
        if isinstance(owner, NOT_IO):
            return  # str.replace, list.remove, a generator's send: not I/O
        if name == "__exit__" and not isinstance(owner, (io.IOBase, socket.socket)):
            return  # a lock's or another context manager's exit, not I/O
        number = next(self._numbers)
        self.count = number + 1
        if number == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def _write_plan(config: Mapping[str, Any], prefix: str, kill_at: int | None) -> None:
    """In the fork: put the plan's batches, dying before I/O call ``kill_at``."""
    cutter = _Cutter(kill_at)
    threading.setprofile(cutter)  # threads the backend starts count too
    handle = _open(config)
    limit = int(config["limit"])
    for number, batch in enumerate(crash_plan(limit)):
        keys = [crash_key(prefix, index) for index, _ in batch]
        blocks: list[BytesLike] = [block_for(k, size) for k, (_, size) in zip(keys, batch)]
        evicted: list[tuple[bytes, BytesLike]] = []
        print(f"begin {number}", flush=True)
        cutter.armed = True
        sys.setprofile(cutter)
        try:
            handle.put(keys, blocks, evicted)
        finally:
            sys.setprofile(None)
            cutter.armed = False
        print(f"done {number} {cutter.count}", flush=True)
    print(f"events {cutter.count}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # a crash after the last acknowledged put


def steps(config: Mapping[str, Any]) -> int:
    """Serve one forked writer per line of stdin until stdin closes."""
    resolve_backend(config["backend"])  # import the backend once, before forking
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                _write_plan(config, str(job["prefix"]), job["kill_at"])
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(3)  # only reached when the writer raised
        _, status = os.waitpid(pid, 0)
        print(f"exit {status}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    config: dict[str, Any] = json.loads(argv[0])
    mode = config.get("mode", "stream")
    if mode == "steps":
        return steps(config)
    return stream(config)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
