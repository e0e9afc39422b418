"""kvtier's SGLang backend under a hybrid model: the v2 calls, with SGLang 0.5.23's own
host pools on the CPU (an MHA KV pool, a ``MambaPoolHost`` of per-request states, and
an MHA pool standing for a sliding-window pool); tiers are real (host and fs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang 0.5.23 is not installed (make venv installs it)", allow_module_level=True)

import torch
from sglang_host import mamba_pool, mha_pool
from sglang_pages import attach, host_fs, indices, page_hashes, save_v1

from kvtier.contrib.sglang.keys import storage_key
from kvtier.contrib.sglang.storage import KvtierStorage


# v2: hybrid models ------------------------------------------------------------------------
def fill_pool_random(pool: Any, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    buffers = pool.kv_buffer if isinstance(pool.kv_buffer, list) else [pool.kv_buffer]
    for buffer in buffers:
        raw = buffer.view(-1).view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))


def test_v2_stores_a_hybrid_models_extra_pools_and_hits_only_whole_pages(
    tmp_path: Path,
) -> None:
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    chain_yaml = host_fs(tmp_path)
    kv, mamba, swa = mha_pool("page_first"), mamba_pool(), mha_pool("page_first")
    for seed, pool in enumerate((kv, mamba, swa)):
        fill_pool_random(pool, seed=20 + seed)
    keys = page_hashes(4, seed=12)

    def attach_hybrid(mamba_host: Any) -> KvtierStorage:
        backend = attach(chain_yaml, kv)
        for name, pool in ((PoolName.KV, kv), (PoolName.MAMBA, mamba_host), (PoolName.SWA, swa)):
            backend.register_mem_host_pool_v2(pool, name)
        backend.on_host_pools_registered()
        return backend

    def state(slot: int, page: str) -> Any:  # a Mamba state: the last page's only
        return PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([slot]), keys=[page],
                            hit_policy=PoolHitPolicy.TRAILING_PAGES)

    backend = attach_hybrid(mamba)
    assert save_v1(backend, kv, keys, first_page=0)
    saved = backend.batch_set_v2([
        state(1, keys[3]),  # the state after the last page
        PoolTransfer(PoolName.SWA, host_indices=indices(0, 2), keys=keys[:2]),  # pages 0 and 1
    ])
    assert saved == {PoolName.MAMBA: [True], PoolName.SWA: [True, True]}
    backend.close()

    reader = attach_hybrid(mamba)  # another process: everything comes from disk
    found = reader.batch_exists_v2(keys, [state(0, keys[3])])
    assert (found.kv_hit_pages, found.restorable_prefix_pages) == (4, [4])
    assert found.extra_pool_hit_pages == {PoolName.KV: 4, PoolName.MAMBA: 4}
    swa_all = PoolTransfer(PoolName.SWA, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)
    found = reader.batch_exists_v2(keys, [swa_all])
    assert (found.kv_hit_pages, found.restorable_prefix_pages) == (2, [1, 2])
    # a page is whole only with all its parts: no state for page 3, no prefix at all
    assert reader.batch_exists_v2(keys, [state(0, keys[3]), swa_all]).kv_hit_pages == 0
    assert reader.chain.evict([storage_key(keys[3], 2)]) == 1  # V of page 3 gone
    found = reader.batch_exists_v2(keys, [state(0, keys[3])])
    assert (found.kv_hit_pages, found.restorable_prefix_pages) == (0, [])

    # loads put the checked bytes back, and nothing else
    before = bytes(mamba.get_data_page(5).numpy())
    two = PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([6, 5]), keys=[keys[3], keys[0]],
                       hit_policy=PoolHitPolicy.TRAILING_PAGES)
    assert reader.batch_get_v2([two]) == {PoolName.MAMBA: [True, False]}
    assert bytes(mamba.get_data_page(6).numpy()) == bytes(mamba.get_data_page(1).numpy())
    assert bytes(mamba.get_data_page(5).numpy()) == before
    assert reader.batch_get_v2([PoolTransfer("nosuch", host_indices=torch.tensor([0]),
                                             keys=keys[:1])]) == {"nosuch": [False]}
    assert reader.faults == 1
    reader.close()

    # a pool without flat pages (SGLang registers every pool at attach) only faults when used
    class NoFlatPages:
        page_size = 1

        def get_dummy_flat_data_page(self) -> Any:
            raise NotImplementedError("split-head pages have no flat form")

    odd = attach_hybrid(mamba)
    odd.register_mem_host_pool_v2(NoFlatPages(), PoolName.INDEXER)
    assert odd.batch_set_v2([PoolTransfer(PoolName.INDEXER, host_indices=torch.tensor([0]),
                                          keys=keys[:1])]) == {PoolName.INDEXER: [False]}
    assert odd.faults == 1
    odd.close()

    # a state pool of another shape never answers for the stored states
    other = attach_hybrid(mamba_pool(state=8))
    assert other.batch_get_v2([state(2, keys[3])]) == {PoolName.MAMBA: [False]}
    other.close()
