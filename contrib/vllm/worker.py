"""Copies between the engine's KV cache and vLLM's shared host region, on the CPU.

vLLM's own offloading worker drives CUDA/XPU copy engines and refuses other
devices.  On vLLM's CPU platform the engine's KV cache is ordinary memory, so
:class:`HostCopyWorker` copies with torch indexing, synchronously, inside
``submit_store``/``submit_load`` (the model has finished writing a block
before the connector offers it for storing: CPU execution is synchronous).

It writes into the strided per-worker views of the same
:class:`SharedOffloadRegion` file the scheduler maps; the secondary tiers
read that file through ``primary_kv_view``, so a private buffer would leave
them blind.

A transfer naming a chunk outside the host region fails (its result says
so) and copies nothing.

Supported: several KV-cache groups, ``blocks_per_chunk > 1`` (a chunk's
first/last engine block may be partial, as in vLLM's worker), tensors with
padded pages.  Not supported: vLLM's ``canonical_layout`` (refused by the
spec with a clear error).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from kvtier.observe import phases

from ._compat import (
    CanonicalKVCaches,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
    engine_blocks,
)
from .parallel_copy import ParallelCopy

__all__ = ["COPY_THREADS", "HostCopyWorker"]

#: Threads that copy one transfer: the caller and a helper (:mod:`.parallel_copy`).
COPY_THREADS = 2


def _engine_view(tensor: torch.Tensor, page_size: int) -> torch.Tensor:
    """A 2-D int8 ``(num_blocks, page)`` view of one engine KV tensor."""
    if tensor.dtype == torch.int8 and tensor.ndim == 2:
        return tensor
    return tensor.view(torch.int8).view(-1, page_size)


def _runs(blocks: np.ndarray, slots: np.ndarray, bpc: int) -> list[tuple[int, int, int, int]]:
    """``(first block, chunk, position in chunk, count)`` for each stretch of blocks
    that are consecutive both in the engine and in the host region.

    One copy per stretch instead of one indexed copy per block: torch's
    indexed copy of int8 pages moves a byte at a time, several times slower
    than a strided memcpy.
    """
    if not len(blocks):
        return []
    cut = (np.diff(blocks) != 1) | (np.diff(slots) != 1)
    if bpc > 1:  # a stretch stays within one chunk
        cut |= np.diff(slots // bpc) != 0
    starts = np.concatenate(([0], np.flatnonzero(cut) + 1))
    ends = np.concatenate((starts[1:], [len(blocks)]))
    return [
        (int(blocks[s]), int(slots[s]) // bpc, int(slots[s]) % bpc, int(e - s))
        for s, e in zip(starts, ends)
    ]


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src`` into ``dst`` (int8 views of one shape) in this thread, with numpy.

    torch's ``copy_`` splits a large copy over its intra-op (OpenMP) threads,
    which on vLLM's CPU build are the model's own: on two busy cores the copy
    of a 2048-token prompt's 128 MiB into the engine's KV cache waited on
    descheduled threads, 246 ms median and up to 2.0 s, against 101 ms (at
    most 229 ms) for this copy in the same run (BENCHMARKS.md, "Where a
    hit's time goes").  A copy in the calling thread waits only for memory.
    """
    np.copyto(dst.numpy(), src.numpy())


class HostCopyWorker(OffloadingWorker):  # type: ignore[misc, unused-ignore]
    """An ``OffloadingWorker`` for vLLM's CPU platform (see the module docstring)."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, region: Any) -> None:
        if blocks_per_chunk < 1:
            raise ValueError(f"blocks_per_chunk must be >= 1, got {blocks_per_chunk}")
        self._bpc = blocks_per_chunk
        self._region = region
        self._refs = [list(group) for group in kv_caches.group_data_refs]
        self._tensors = list(kv_caches.tensors)
        self._engine: list[torch.Tensor] = []
        # per tensor: (num_chunks, blocks_per_chunk, page) view into this worker's slot
        self._host: list[torch.Tensor] = []
        for t in kv_caches.tensors:
            engine = _engine_view(t.tensor, t.page_size_bytes)
            page = int(engine.shape[1])
            host = region.create_next_worker_view(page * blocks_per_chunk)
            self._engine.append(engine)
            self._host.append(host.unflatten(1, (blocks_per_chunk, page)))
        self._done: list[TransferResult] = []
        self._parallel = ParallelCopy(_copy, threads=COPY_THREADS)

    # OffloadingWorker --------------------------------------------------------
    # The engine side is a GPULoadStoreSpec up to vLLM 0.33 and DevicePointers
    # from 0.34; _compat.engine_blocks reads either.  An expedited load (0.33)
    # needs nothing special: every copy finishes inside its submit call.
    def submit_store(self, job_id: int, src_spec: Any, dst_spec: LoadStoreSpec) -> bool:
        return self._transfer(job_id, src_spec, dst_spec, to_host=True)

    def submit_load(
        self, job_id: int, src_spec: LoadStoreSpec, dst_spec: Any, expedited: bool = False
    ) -> bool:
        return self._transfer(job_id, dst_spec, src_spec, to_host=False)

    def get_finished(self) -> list[TransferResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return None  # every copy finished inside its submit call

    def shutdown(self) -> None:
        self._parallel.shutdown()
        self._engine.clear()
        self._host.clear()
        self._tensors.clear()
        region, self._region = self._region, None
        if region is not None:
            region.cleanup()

    # copying -------------------------------------------------------------------
    def _in_region(self, chunk_ids: np.ndarray) -> bool:
        """Whether every chunk id names a chunk of the host region.

        Out of it, torch's slicing gives an empty view that a one-block copy
        broadcasts into silently: the job would report success and copy
        nothing.  Such a job fails whole instead, before any copy.
        """
        chunks = min((int(h.shape[0]) for h in self._host), default=0)
        return bool(((chunk_ids >= 0) & (chunk_ids < chunks)).all())

    def _transfer(self, job_id: int, engine_spec: Any, host_spec: Any, *, to_host: bool) -> bool:
        start = time.perf_counter()
        ids, group_sizes, block_indices = engine_blocks(engine_spec, self._tensors, self._refs)
        engine_ids = np.asarray(ids, dtype=np.int64)
        chunk_ids = np.asarray(host_spec.block_ids, dtype=np.int64)
        if len(group_sizes) != len(self._refs):
            raise ValueError(
                f"transfer names {len(group_sizes)} KV-cache group(s), the worker has "
                f"{len(self._refs)}"
            )
        if not self._in_region(chunk_ids):
            self._done.append(TransferResult(job_id=job_id, success=False, transfer_size=0,
                                             transfer_time=time.perf_counter() - start))
            return True
        bpc = self._bpc
        engine_pos = chunk_pos = 0
        nbytes = 0
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (destination, source)
        for refs, size, first_block in zip(self._refs, group_sizes, block_indices):
            if not size:
                continue
            # A chunk holds bpc engine blocks; a group's run of blocks may start
            # part-way into its first chunk (first_block % bpc blocks in).
            skip = int(first_block) % bpc
            num_chunks = -(-(size + skip) // bpc)
            group_engine = engine_ids[engine_pos : engine_pos + size]
            group_chunks = chunk_ids[chunk_pos : chunk_pos + num_chunks]
            if len(group_engine) != size or len(group_chunks) != num_chunks:
                raise ValueError("transfer spec lists fewer blocks than its group sizes say")
            # slot = chunk * bpc + position of the block in its chunk
            slots = (group_chunks[:, None] * bpc + np.arange(bpc)).ravel()[skip : skip + size]
            runs = _runs(group_engine, slots, bpc)
            for ref in refs:
                engine = self._engine[ref.tensor_idx]
                host = self._host[ref.tensor_idx]
                n = int(ref.page_size_bytes)
                for block, chunk, part, count in runs:
                    e = engine[block : block + count, :n]
                    if bpc == 1:  # consecutive chunks: one strided copy
                        h = host[chunk : chunk + count, 0, :n]
                    else:  # consecutive blocks of one chunk
                        h = host[chunk, part : part + count, :n]
                    pairs.append((h, e) if to_host else (e, h))
                nbytes += size * n
            engine_pos += size
            chunk_pos += num_chunks
        if engine_pos != len(engine_ids) or chunk_pos != len(chunk_ids):
            raise ValueError("transfer spec lists more blocks than its group sizes say")
        self._parallel(pairs)
        phases.span("to host" if to_host else "to device", start, time.perf_counter(),
                    len(chunk_ids))
        self._done.append(
            TransferResult(
                job_id=job_id,
                success=True,
                transfer_size=nbytes,
                transfer_time=time.perf_counter() - start,
            )
        )
        return True
