"""Large copies between the engine's KV cache and the host region, on two threads.

One thread does not reach the memory's rate: on a 2-core machine a 128 MiB
copy took 19.3-20.3 ms (median) on one thread and 13.8-15.1 ms on two
(``bench/host_copy.py``); in vLLM a 2048-token hit's copy into the engine's
KV cache took 17.9-21.8 ms at the median against 23.1-25.3 on one thread in
the same runs (BENCHMARKS.md, "The copy to the device on two threads").
A hit waits for this copy after its whole load, so it is on every hit's
critical path.

The two threads share the pieces of a copy rather than splitting it in
halves: the calling thread takes pieces until none is left, and then waits
only for a piece the helper is still copying.  A helper that is not
scheduled (its core busy with something else) costs the caller at most one
piece (:data:`PIECE_BYTES`), never the half a fixed split would leave it:
torch's own parallel copy, whose OpenMP threads are the model's, waited on
descheduled threads for up to 2 s (see :func:`kvtier.contrib.vllm.worker._copy`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["MIN_SHARED_BYTES", "PIECE_BYTES", "ParallelCopy", "pieces"]

#: Bytes one piece moves, at most (a piece is whole rows, so one row more than this
#: when a row is larger): a helper descheduled mid-piece delays the caller by one
#: piece's copy, about 0.2 ms at this size.
PIECE_BYTES = 1 << 20
#: Copies smaller than this run on the calling thread alone: handing a piece to the
#: helper costs tens of microseconds, a 4 MiB copy about half a millisecond.
MIN_SHARED_BYTES = 4 << 20

Copy = Callable[[Any, Any], None]


def pieces(pairs: Sequence[tuple[Any, Any]], piece_bytes: int = PIECE_BYTES
           ) -> Iterator[tuple[Any, Any]]:
    """Cut each ``(dst, src)`` pair of equal-shaped 2-D views into pieces of whole
    rows, about ``piece_bytes`` each (at least one row)."""
    for dst, src in pairs:
        rows = int(dst.shape[0])
        row_bytes = int(dst.shape[1]) * int(dst.element_size()) if rows else 0
        step = max(1, piece_bytes // row_bytes) if row_bytes else max(rows, 1)
        for start in range(0, rows, step):
            yield dst[start : start + step], src[start : start + step]


class _Job:
    """One call's pieces, handed out to whichever thread asks next."""

    def __init__(self, work: list[tuple[Any, Any]], copy: Copy) -> None:
        self._work = work
        self._copy = copy
        self._lock = threading.Lock()
        self._next = 0
        self._busy = 0  # pieces the helper took and has not finished
        self._idle = threading.Event()
        self._idle.set()
        self.error: BaseException | None = None

    def run(self, *, helper: bool) -> None:
        while True:
            with self._lock:
                if self._next >= len(self._work) or self.error is not None:
                    return
                dst, src = self._work[self._next]
                self._next += 1
                if helper:
                    self._busy += 1
                    self._idle.clear()
            try:
                self._copy(dst, src)
            except BaseException as exc:
                with self._lock:
                    if self.error is None:
                        self.error = exc
                if not helper:
                    raise
            finally:
                if helper:
                    with self._lock:
                        self._busy -= 1
                        if not self._busy:
                            self._idle.set()

    def wait_helper(self) -> None:
        """Wait for the pieces the helper took; a helper that took none is not waited for."""
        self._idle.wait()
        if self.error is not None:
            raise self.error


class ParallelCopy:
    """Runs ``copy(dst, src)`` over the pieces of a list of pairs, on the calling
    thread and one helper thread of its own (see the module docstring).

    ``copy`` must release the GIL while it copies (``numpy.copyto`` does), or
    the helper only takes turns with the caller.
    """

    def __init__(self, copy: Copy, *, threads: int = 2) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._copy = copy
        self._pool = (ThreadPoolExecutor(threads - 1, thread_name_prefix="kvtier-copy")
                      if threads > 1 else None)
        self._helpers = threads - 1

    def __call__(self, pairs: Sequence[tuple[Any, Any]]) -> None:
        total = sum(int(d.numel()) * int(d.element_size()) for d, _ in pairs)
        if self._pool is None or total < MIN_SHARED_BYTES:
            for dst, src in pairs:
                self._copy(dst, src)
            return
        job = _Job(list(pieces(pairs)), self._copy)
        for _ in range(self._helpers):
            self._pool.submit(job.run, helper=True)
        job.run(helper=False)
        job.wait_helper()

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
