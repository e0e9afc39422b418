"""Reads that land uncompressed blocks straight in a caller's buffers, checked as they land.

A tier reads a batch of uncompressed blocks with the backend's ``get_into``:
each block's header into a small buffer of its own, its payload straight
into the caller's memory (:func:`~kvtier.block.framing.scatter_for`).  Each
payload is checked against its header before it counts as a hit.  Checked
after the whole batch has landed, that is a second pass over the batch while
the medium sits idle: 12 ms after 46 ms of O_DIRECT reads for 64 blocks of
2 MiB (``bench/vllm_ttft.py`` put it at 16 ms of a 128 MiB hit).

:class:`ScatterReads` reads a large batch in :data:`RUNS` runs, by
concurrent ``get_into`` calls, and checks each run as soon as its call
returns, while the later runs are still on their way: the checks ride on
the reads, and only the last run's trail the medium's last byte.  The
checksum releases the GIL where the C extension is built
(:func:`~kvtier.block.framing.check_payload`), so the backend's threads go
on issuing reads meanwhile.  A batch under :data:`RUN_MIN` bytes a run, or
a backend that takes one call at a time, is read in one call as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait

from kvtier.block import framing
from kvtier.block.crypt import Keyring
from kvtier.chain.arguments import runs_of
from kvtier.spec import CorruptBlockError

__all__ = ["IN_FLIGHT", "RUNS", "RUN_MIN", "ScatterReads", "landed_header"]

#: Runs a large batch is read in: the checks left after the last read are about 1/RUNS.
RUNS = 8
#: No run under this many bytes: below it a call costs more than the checks it overlaps.
RUN_MIN = 4 << 20
#: Run calls in flight at once, each a batch the backend spreads over its own threads.
IN_FLIGHT = 4

#: A backend's ``get_into`` through the tier's breaker: sizes, or None where it failed.
GetInto = Callable[[Sequence[bytes], Sequence[list[memoryview]]], Sequence[int | None] | None]


def landed_header(
    namespace: bytes, key: bytes, head: bytearray, out: memoryview, size: int,
    verify: bool, seal: Keyring | None,
) -> framing.Header | None:
    """The header of a block that a :func:`~kvtier.block.framing.scatter_for` list
    read whole (``size`` bytes) and that checks out; None where it must be read
    whole by ``get`` instead: compressed, of another size, or split otherwise
    (``Tier.decode`` then tells a block of another size from a damaged one).

    Raises :class:`~kvtier.spec.CorruptBlockError` where the layout fits and the
    payload fails its check (the checksum, or a sealed block's tag).
    """
    if size != len(head) + out.nbytes:
        return None
    try:
        header = framing.parse_header(head, namespace, key)
    except CorruptBlockError:
        return None
    layout = (header.size + framing.trailer(header), header.codec, header.raw_len)
    if layout != (len(head), framing.CODEC_NONE, out.nbytes):
        return None
    framing.check_scattered(header, head, out, verify, seal)
    return header


class ScatterReads:
    """A tier's reads in runs, each handed to ``landed`` as its call returns."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def read(
        self,
        get_into: GetInto,
        keys: Sequence[bytes],
        scatter: Sequence[list[memoryview]],
        sizes: Sequence[int],
        landed: Callable[[int, int | None], None],
        *,
        whole: bool = False,
    ) -> None:
        """Read ``keys`` through ``get_into``; ``landed(i, size)`` for each block,
        ``size`` None where it is missing or its run's call failed.

        ``sizes``: the payloads' bytes, which size the runs.  ``whole``: one call
        (a backend in this process, or one that takes a call at a time).
        ``landed`` runs on the calling thread.  Returns only once every call has
        returned, so no read of the batch writes the caller's buffers later.
        """
        runs = [(0, len(keys))] if whole else runs_of(sizes, max(RUN_MIN, -(-sum(sizes) // RUNS)))
        pool = self._pool_for(len(runs))
        if pool is None:
            self._land(0, get_into(keys, scatter), len(keys), landed)
            return
        futures: dict[Future[Sequence[int | None] | None], int] = {}
        try:
            for lo, hi in runs:
                futures[pool.submit(get_into, keys[lo:hi], scatter[lo:hi])] = lo
        except RuntimeError:  # closed meanwhile: the tier's call raises ClosedError
            pass
        try:
            for future in as_completed(futures):
                lo = futures[future]
                got = future.result()
                self._land(lo, got, len(got) if got is not None else 0, landed)
        finally:
            wait(futures)

    @staticmethod
    def _land(first: int, got: Sequence[int | None] | None, n: int,
              landed: Callable[[int, int | None], None]) -> None:
        for j in range(n):
            landed(first + j, None if got is None else got[j])

    def _pool_for(self, runs: int) -> ThreadPoolExecutor | None:
        if runs < 2:
            return None
        with self._lock:
            if self._pool is None and not self._closed:
                self._pool = ThreadPoolExecutor(IN_FLIGHT,
                                                thread_name_prefix=f"kvtier-{self._name}")
            return self._pool

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
