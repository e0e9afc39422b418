"""Clearing, detaching and attaching kvtier's SGLang backend, through SGLang 0.5.23's own code.

``clear()`` as SGLang's clear endpoint reaches it; runtime detach and a
second attach in one process through SGLang's ``attach_storage_backend`` and
``detach_storage_backend``.  Pages live in SGLang's own host KV pools on the
CPU; tiers are real (host and fs in ``tmp_path``).
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang 0.5.23 is not installed (make venv installs it)", allow_module_level=True)

from sglang_host import mha_pool
from sglang_pages import (
    PAGE,
    attach,
    fill_random,
    host_fs,
    indices,
    load_v1,
    page_bytes,
    page_hashes,
    save_v1,
    storage_config,
    stored_blocks,
    write_chain,
)

import kvtier
from kvtier.contrib.sglang import extra_config
from kvtier.contrib.sglang.keys import storage_key
from kvtier.contrib.sglang.storage import KvtierStorage


# clear ------------------------------------------------------------------------------------
def test_clear_removes_this_ranks_blocks_from_every_tier_and_keeps_the_others(
    tmp_path: Path,
) -> None:
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    chain_yaml = host_fs(tmp_path)
    pool, other_pool = mha_pool("page_first"), mha_pool("page_first")
    fill_random(pool, seed=8)
    fill_random(other_pool, seed=9)
    keys = page_hashes(4, seed=8)
    backend = attach(chain_yaml, pool)
    rank1 = attach(chain_yaml, other_pool, tp_rank=1, tp_size=2)  # another rank, same store
    assert save_v1(backend, pool, keys, first_page=0)
    assert save_v1(rank1, other_pool, keys, first_page=0)
    backend.chain.flush()
    rank1.chain.flush()
    assert len(stored_blocks(tmp_path / "fs", backend.chain.namespace.hex)) == 4 * 2

    # SGLang's clear endpoint, down to the backend (its attachment reports what this returns)
    state = SimpleNamespace(enable_storage=True, storage_backend=backend)
    assert HybridCacheController.clear_storage_backend(state) is True
    assert backend.clear() is True  # nothing left: clearing again succeeds
    assert backend.batch_exists(keys) == 0  # neither in the RAM tier nor on disk
    assert backend.batch_get_v1(keys, indices(8, 4)) == [False] * 4
    assert stored_blocks(tmp_path / "fs", backend.chain.namespace.hex) == []
    backend.close()
    again = attach(chain_yaml, mha_pool("page_first"))  # a new process finds nothing either
    assert again.batch_exists(keys) == 0
    again.close()

    # the other rank's pages stay, byte for byte
    assert rank1.batch_exists(keys) == 4
    assert load_v1(rank1, other_pool, keys, first_page=8) == 4
    assert page_bytes(other_pool, 8, 4) == page_bytes(other_pool, 0, 4)
    rank1.close()
    assert rank1.clear() is False  # closed: there is no namespace to clear


class KeepsEverything:
    """A store that lists its blocks but whose deletes fail (a read-only bucket, say)."""

    def __init__(self) -> None:
        self.blocks: dict[bytes, bytes] = {}
        self.namespace = ""

    @kvtier.spec.hookimpl
    def kvtier_open(self, options: Any, namespace: str) -> None:
        self.namespace = namespace

    @kvtier.spec.hookimpl
    def kvtier_put(self, keys: Any, blocks: Any) -> list[bool]:
        self.blocks.update((k, bytes(b)) for k, b in zip(keys, blocks))
        return [True] * len(keys)

    @kvtier.spec.hookimpl
    def kvtier_get(self, keys: Any) -> list[bytes | None]:
        return [self.blocks.get(k) for k in keys]

    @kvtier.spec.hookimpl
    def kvtier_lookup(self, keys: Any) -> list[bool]:
        return [k in self.blocks for k in keys]

    @kvtier.spec.hookimpl
    def kvtier_evict(self, keys: Any) -> list[bool]:
        raise kvtier.spec.BackendError("permission denied")

    @kvtier.spec.hookimpl
    def kvtier_scan(self, namespace: str | None) -> Any:
        return iter([[(self.namespace, k, len(b), None) for k, b in self.blocks.items()]])


def test_clear_says_so_when_a_tier_kept_its_blocks(tmp_path: Path) -> None:
    from kvtier.plugins.registry import default_registry

    default_registry().register("sglang-test-keeps", KeepsEverything)
    chain_yaml = write_chain(tmp_path / "tiers.yaml", [
        {"name": "kept", "backend": "sglang-test-keeps"}])
    pool = mha_pool("page_first")
    fill_random(pool, seed=11)
    keys = page_hashes(2, seed=11)
    backend = attach(chain_yaml, pool)
    assert save_v1(backend, pool, keys, first_page=0)
    assert backend.clear() is False
    backend.close()


# runtime attach and detach ----------------------------------------------------------------
def attaching_controller(pool: Any) -> Any:
    """SGLang's own ``attach_storage_backend`` / ``detach_storage_backend``, as its admin
    endpoints run them, on a controller whose storage threads, parallel groups and rank
    config are left out (nothing here runs them: pages move through the page methods)."""
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry

    class Controller(HybridCacheController):  # type: ignore[misc]
        def __init__(self) -> None:  # the attributes attach and detach read
            self.enable_storage, self.host_memory_mode, self.page_size = False, "cache", PAGE
            self.storage_host_pool = pool
            self.mem_pool_host = HostPoolGroup(
                [PoolEntry(PoolName.KV, pool, None, lambda layer: layer, True)])
            self.storage_stop_event = threading.Event()
            self.pp_group = self.attn_cp_group = self.attn_tp_group = self.tp_group = None
            self.pp_prefetch_command_group = self.pp_prefetch_command_thread = None
            self.pp_prefetch_state_lock = threading.Lock()
            self.pp_prefetch_states, self.pp_prefetch_decisions = {}, {}
            self.prefetch_hits_sync_groups, self.prefetch_completion_sync_groups = [], []

        def _generate_storage_config(self, model_name: Any = None, extra: Any = None) -> Any:
            return storage_config(extra, is_page_first_layout=pool.layout == "page_first")

        def _start_storage_threads(self) -> None:
            pass

    return Controller()


def test_detach_and_attach_again_in_one_process(tmp_path: Path) -> None:
    from sglang.srt.runtime_context import get_parallel

    chain_yaml = write_chain(tmp_path / "tiers.yaml", [
        {"name": "ram", "backend": "host", "capacity": "64MiB"},
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "fs"), "write": "back"}])
    pool = mha_pool("page_first")
    fill_random(pool, seed=10)
    keys = page_hashes(4, seed=10)
    extra = extra_config(chain_yaml, interface_v1=True, keep_host_tier=True)
    control = attaching_controller(pool)
    with get_parallel().override(attn_dcp_size=1):
        # an attach that fails (a chain file that is not there) leaves it detached
        with pytest.raises(kvtier.ConfigError, match=r"missing\.yaml"):
            control.attach_storage_backend("dynamic", storage_backend_extra_config={
                **extra, "kvtier_config": str(tmp_path / "missing.yaml")})
        assert control.storage_backend is None and not control.enable_storage
        attached = []
        for _ in range(3):
            control.attach_storage_backend(
                "dynamic", storage_backend_extra_config=dict(extra),
                host_pools=control.mem_pool_host.entries)
            attached.append(backend := control.storage_backend)
            assert isinstance(backend, KvtierStorage)
            namespace = backend.chain.namespace.hex
            assert control.page_set_func.__name__ == "_page_set_zero_copy"
            if len(attached) == 1:
                assert control.page_set_func(keys, indices(0, 4))  # only in RAM until detach
                assert stored_blocks(tmp_path / "fs", namespace) == []
            else:  # the RAM tier was saved to disk at detach; the new chain reads it back
                assert backend.batch_exists(keys) == 4
                assert load_v1(backend, pool, keys, first_page=8 + 4 * len(attached)) == 4
                assert page_bytes(pool, 8 + 4 * len(attached), 4) == page_bytes(pool, 0, 4)
            chain = backend.chain
            control.detach_storage_backend()
            assert control.storage_backend is None and backend.chain is None
            with pytest.raises(kvtier.ClosedError):
                chain.lookup([storage_key(keys[0], 1)])
            # a straggling call on the detached backend is a miss, not an exception
            assert backend.batch_exists(keys) == 0
            assert backend.batch_set_v1(keys, indices(0, 4)) == [False] * 4
        assert len({id(b) for b in attached}) == 3  # a new backend on every attach
    assert len(stored_blocks(tmp_path / "fs", namespace)) == 4 * 2  # K and V of 4 pages
