"""kvtier's CPU copy worker for vLLM (``HostCopyWorker``) with fake KV tensors and region."""

from __future__ import annotations

from typing import Any

import pytest

# --------------------------------------------------------------------------- CPU worker


class FakeRegion:
    """``SharedOffloadRegion``'s per-worker views over a plain tensor (rows padded)."""

    def __init__(self, chunks: int, row: int) -> None:
        import torch

        self.base = torch.zeros(chunks * row, dtype=torch.int8)
        self.chunks, self.row, self.offset, self.cleaned = chunks, row, 0, False

    def create_next_worker_view(self, size: int) -> Any:
        import torch

        view = torch.as_strided(self.base, (self.chunks, size), (self.row, 1), self.offset)
        self.offset += size
        return view

    def cleanup(self) -> None:
        self.cleaned = True


@pytest.mark.parametrize("blocks_per_chunk", [1, 2])
def test_host_copy_worker_moves_blocks_of_several_groups(blocks_per_chunk: int) -> None:
    pytest.importorskip("vllm")
    import torch
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
        GPULoadStoreSpec,
    )
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    from kvtier.contrib.vllm.worker import HostCopyWorker

    bpc, page, blocks = blocks_per_chunk, 64, 12
    engine = [torch.arange(blocks * page, dtype=torch.int32).to(torch.int8).view(blocks, page)
              + t for t in range(2)]
    caches = CanonicalKVCaches(
        [CanonicalKVCacheTensor(e, page) for e in engine],
        [[CanonicalKVCacheRef(0, page)], [CanonicalKVCacheRef(1, page - 8)]],  # padded page
    )
    region = FakeRegion(8, 2 * page * bpc + 128)
    worker = HostCopyWorker(caches, bpc, region)
    # group 0: engine blocks 3,5,4 (not in order) from block index 1 of its run
    # (starting mid-chunk when bpc is 2); group 1: engine blocks 7,8
    skip = 1 % bpc
    chunks0 = -(-(3 + skip) // bpc)
    chunks1 = -(-2 // bpc)
    cpu = list(range(chunks0 + chunks1))
    gpu = GPULoadStoreSpec([3, 5, 4, 7, 8], group_sizes=[3, 2], block_indices=[1, 0])
    assert worker.submit_store(1, gpu, CPULoadStoreSpec(cpu))
    saved = [e.clone() for e in engine]
    for e in engine:
        e.zero_()
    assert worker.submit_load(2, CPULoadStoreSpec(cpu), gpu)
    done = {r.job_id: r for r in worker.get_finished()}
    assert done[1].success and done[2].success
    assert done[1].transfer_size == 3 * page + 2 * (page - 8)
    assert torch.equal(engine[0][3:6], saved[0][3:6])
    assert torch.equal(engine[1][7:9, : page - 8], saved[1][7:9, : page - 8])
    assert not engine[1][7:9, page - 8 :].any()  # padding is not copied
    assert not engine[0][:3].any() and not engine[0][6:].any()
    worker.shutdown()
    assert region.cleaned


@pytest.mark.parametrize("bad", [4, -1])
def test_host_copy_worker_fails_a_transfer_outside_the_host_region(bad: int) -> None:
    pytest.importorskip("vllm")
    import torch
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
        GPULoadStoreSpec,
    )
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    from kvtier.contrib.vllm.worker import HostCopyWorker

    page = 64
    engine = torch.ones(4, page, dtype=torch.int8)
    caches = CanonicalKVCaches([CanonicalKVCacheTensor(engine, page)],
                               [[CanonicalKVCacheRef(0, page)]])
    region = FakeRegion(4, page)
    worker = HostCopyWorker(caches, 1, region)
    gpu = GPULoadStoreSpec([0, 1], group_sizes=[2], block_indices=[0])
    one = GPULoadStoreSpec([2], group_sizes=[1], block_indices=[0])
    assert worker.submit_store(1, gpu, CPULoadStoreSpec([3, bad]))
    assert worker.submit_store(2, one, CPULoadStoreSpec([bad]))
    assert worker.submit_load(3, CPULoadStoreSpec([bad]), one)
    done = {r.job_id: r for r in worker.get_finished()}
    assert [(done[i].success, done[i].transfer_size) for i in (1, 2, 3)] == [(False, 0)] * 3
    assert not region.base.any()  # nothing was copied, not even the good chunk 3
    assert (engine == 1).all()
    worker.shutdown()
