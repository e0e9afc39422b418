"""The CPU worker's copies shared with a helper thread (``kvtier.contrib.vllm.parallel_copy``)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kvtier.contrib.vllm.parallel_copy import (  # noqa: E402
    MIN_SHARED_BYTES,
    PIECE_BYTES,
    ParallelCopy,
    pieces,
)
from kvtier.contrib.vllm.worker import _copy  # noqa: E402


def pairs_of(shapes: list[tuple[int, int]], seed: int = 0) -> list[tuple[Any, Any]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for rows, cols in shapes:
        src = torch.randint(-128, 127, (rows, cols), dtype=torch.int8, generator=gen)
        out.append((torch.zeros(rows, cols, dtype=torch.int8), src))
    return out


def test_pieces_are_whole_rows_that_cover_each_pair_once() -> None:
    row = 300 * 1024  # 3 rows to a 1 MiB piece
    shapes = [(7, row), (1, 3 << 20), (0, 64), (5, 100)]
    pairs = pairs_of(shapes)
    cut = list(pieces(pairs))
    rows_per = [int(d.shape[0]) for d, _ in cut]
    assert rows_per == [3, 3, 1, 1, 5]  # a row over PIECE_BYTES is a piece alone
    assert all(d.shape == s.shape for d, s in cut)
    starts = [d.data_ptr() - pairs[0][0].data_ptr() for d, _ in cut[:3]]
    assert starts == [0, 3 * row, 6 * row]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_shared_copy_is_byte_exact(threads: int) -> None:
    # odd rows and sizes, above MIN_SHARED_BYTES in all
    pairs = pairs_of([(37, 131072 + 8), (5, 999_999), (64, 65536), (3, 17)], seed=threads)
    assert sum(d.numel() for d, _ in pairs) > MIN_SHARED_BYTES
    copier = ParallelCopy(_copy, threads=threads)
    copier(pairs)
    for dst, src in pairs:
        assert torch.equal(dst, src)
    copier.shutdown()


def test_the_helper_takes_pieces() -> None:
    """Each thread's first piece waits, once copied, until the other thread has
    copied one too: both threads copy (a copy on one thread alone would wait out
    the barrier's timeout and fail), whichever of them starts first."""
    both_copied = threading.Barrier(2, timeout=10)
    lock = threading.Lock()
    by_thread: dict[int, int] = {}

    def copy(dst: Any, src: Any) -> None:
        _copy(dst, src)
        me = threading.get_ident()
        with lock:
            first = me not in by_thread
            by_thread[me] = by_thread.get(me, 0) + 1
        if first:
            both_copied.wait()

    pairs = pairs_of([(64, 131072)])  # 8 MiB: 8 pieces
    copier = ParallelCopy(copy, threads=2)
    copier(pairs)
    assert torch.equal(pairs[0][0], pairs[0][1])
    assert sum(by_thread.values()) == 8 * 1048576 // PIECE_BYTES
    assert len(by_thread) == 2 and all(by_thread.values())
    copier.shutdown()


def test_a_helper_that_is_never_scheduled_does_not_hold_the_caller() -> None:
    """The helper's thread is busy elsewhere for the whole call: the caller copies
    every piece itself and returns (a split in halves would wait on the helper)."""
    copier = ParallelCopy(_copy, threads=2)
    release = threading.Event()
    assert copier._pool is not None
    blocker = copier._pool.submit(release.wait, 30)
    pairs = pairs_of([(32, 262144)])
    done = threading.Event()

    def call() -> None:
        copier(pairs)
        done.set()

    caller = threading.Thread(target=call)
    caller.start()
    finished = done.wait(20)
    release.set()
    caller.join()
    blocker.result()
    assert finished, "the copy waited for a helper that never started"
    assert torch.equal(pairs[0][0], pairs[0][1])
    copier.shutdown()


def test_an_error_in_the_helper_reaches_the_caller() -> None:
    main = threading.get_ident()
    helper_failed = threading.Event()

    def copy(dst: Any, src: Any) -> None:
        if threading.get_ident() != main:
            helper_failed.set()
            raise RuntimeError("helper's copy failed")
        assert helper_failed.wait(10)
        _copy(dst, src)

    copier = ParallelCopy(copy, threads=2)
    with pytest.raises(RuntimeError, match="helper's copy failed"):
        copier(pairs_of([(16, 1 << 20)]))
    copier.shutdown()


def test_threads_must_be_positive() -> None:
    with pytest.raises(ValueError, match="threads must be >= 1"):
        ParallelCopy(_copy, threads=0)
