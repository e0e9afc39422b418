"""LMCache's side of the adapter tests: its chunk layout, keys and L1 buffers, the adapter
built by its plugin loader, and its task protocol (submit, wait on the eventfd, collect).

Every adapter here comes from LMCache's own ``--l2-adapter`` parsing and
factory (``parse_args_to_l2_adapters_config`` + ``create_l2_adapter``), and
every buffer from LMCache's L1 memory manager (its mixed host allocator).
``tests/contrib/test_lmcache_*.py`` import this module once they have skipped
without lmcache; the ``l1`` and ``adapter_of`` fixtures in
``tests/contrib/conftest.py`` run :func:`l1_manager` and :func:`adapter_factory`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
from lmcache.v1.distributed.config import L1MemoryManagerConfig
from lmcache.v1.distributed.internal_api import L2AdapterListener
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import (
    add_l2_adapters_args,
    parse_args_to_l2_adapters_config,
)
from lmcache.v1.distributed.memory_manager.l1_memory_manager import (
    L1MemoryManager,
)

from kvtier.contrib.lmcache import KvtierL2Adapter

MODEL = "tiny/llama"
# one LMCache chunk: (kv, layers, tokens, hidden) in bf16 = 16 KiB
LAYOUT = MemoryLayoutDesc(shapes=[torch.Size([2, 2, 32, 64])], dtypes=[torch.bfloat16])
CHUNK = 2 * 2 * 32 * 64 * 2
DESCS = {0: LAYOUT}
WAIT_S = 30.0


# --- LMCache-side helpers -------------------------------------------------------------
def l1_manager() -> Iterator[L1MemoryManager]:
    """LMCache's L1 memory manager on the CPU: its MixedMemoryAllocator, no shared memory."""
    manager = L1MemoryManager(L1MemoryManagerConfig(size_in_bytes=32 << 20, use_lazy=False,
                                                    shm_name=""))
    yield manager
    with _ALLOCATED_LOCK:
        live = [obj for obj in _ALLOCATED if obj.is_valid()]
        _ALLOCATED.clear()
    manager.free(live)
    manager.close()


_ALLOCATED: list[Any] = []
_ALLOCATED_LOCK = threading.Lock()


def objects(l1: L1MemoryManager, n: int) -> list[Any]:
    error, objs = l1.allocate(LAYOUT, n)
    assert objs, error
    with _ALLOCATED_LOCK:
        _ALLOCATED.extend(objs)
    return objs


def fill(objs: list[Any], seed: int) -> list[bytes]:
    """Random content into each object; what each now holds."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for obj in objs:
        obj.tensor.copy_(torch.randn(obj.tensor.shape, generator=gen, dtype=torch.float32))
        out.append(bytes(obj.byte_array))
    return out


def okey(i: int, salt: str = "", rank: int = 0, group: int = 0, model: str = MODEL) -> ObjectKey:
    return ObjectKey(chunk_hash=i.to_bytes(8, "big") * 4, model_name=model, kv_rank=rank,
                     object_group_id=group, cache_salt=salt)


def stored_keys(tokens: list[int], salt: str, chunk_size: int,
                algorithm: str = "blake3") -> list[Any]:
    """The keys LMCache's server stores a request's chunks under (worker 0 of 1, MODEL),
    as its own session manager and key resolver compute them."""
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
    from lmcache.v1.multiprocess.engine_context import MPCacheServerContext
    from lmcache.v1.multiprocess.session import SessionManager
    from lmcache.v1.multiprocess.token_hasher import TokenHasher

    context = SimpleNamespace(session_manager=SessionManager(
        TokenHasher(chunk_size=chunk_size, hash_algorithm=algorithm), cleanup_interval=None))
    key = IPCCacheServerKey(model_name=MODEL, world_size=1, worker_id=0,
                            token_ids=tuple(tokens), start=0,
                            end=len(tokens) - len(tokens) % chunk_size, request_id="r",
                            cache_salt=salt)
    return list(MPCacheServerContext.resolve_obj_keys(context, key, [0])[0])


def build(params: dict[str, Any]) -> KvtierL2Adapter:
    """The adapter exactly as LMCache's server builds it from ``--l2-adapter``."""
    parser = add_l2_adapters_args(argparse.ArgumentParser())
    spec = {"type": "plugin", "module_path": "kvtier.contrib.lmcache",
            "class_name": "KvtierL2Adapter", "adapter_params": params}
    args = parser.parse_args(["--l2-adapter", json.dumps(spec)])
    (config,) = parse_args_to_l2_adapters_config(args).adapters
    adapter = create_l2_adapter(config)
    assert isinstance(adapter, KvtierL2Adapter)
    return adapter


def write_yaml(path: Path, chain: list[dict[str, Any]]) -> str:
    path.write_text(yaml.safe_dump({"chain": chain}))
    return str(path)


def host_fs(tmp_path: Path, ram: int = 1 << 20, write: str = "through") -> str:
    return write_yaml(tmp_path / "tiers.yaml", [
        {"name": "ram", "backend": "host", "capacity": ram},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/fs", "write": write},
    ])


def adapter_factory() -> Iterator[Callable[..., KvtierL2Adapter]]:
    made: list[KvtierL2Adapter] = []

    def make(yaml_path: str, **params: Any) -> KvtierL2Adapter:
        made.append(build({"kvtier_config": yaml_path, **params}))
        return made[-1]

    yield make
    for adapter in made:
        adapter.close()


def wait_fd(fd: int) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    assert poller.poll(WAIT_S * 1000), "eventfd never signalled"
    os.eventfd_read(fd)


def until(fn: Callable[[], Any], fd: int) -> Any:
    """Wait on ``fd`` until ``fn`` has a result, as LMCache's controllers do."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        result = fn()
        if result is not None:
            return result
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if poller.poll(100):
            with contextlib.suppress(BlockingIOError):  # another waiter took the signal
                os.eventfd_read(fd)
    raise AssertionError("task never completed")


_POPPED: dict[tuple[int, int], Any] = {}  # store results popped by another thread
_POPPED_LOCK = threading.Lock()


def store(adapter: KvtierL2Adapter, keys: list[ObjectKey], objs: list[Any]) -> Any:
    task = adapter.submit_store_task(keys, objs)

    def done() -> Any:
        with _POPPED_LOCK:  # pop_completed_store_tasks hands over every finished task
            for task_id, result in adapter.pop_completed_store_tasks().items():
                _POPPED[(id(adapter), task_id)] = result
            return _POPPED.pop((id(adapter), task), None)

    return until(done, adapter.get_store_event_fd())


def lock(
    adapter: KvtierL2Adapter, keys: list[ObjectKey], descs: dict[int, Any] | None = None
) -> list[bool]:
    """Lookup-and-lock; ``descs`` is LMCache's advisory layout hint (default: ``DESCS``)."""
    task = adapter.submit_lookup_and_lock_task(keys, DESCS if descs is None else descs)
    bitmap = until(lambda: adapter.query_lookup_and_lock_result(task),
                   adapter.get_lookup_and_lock_event_fd())
    return [bitmap.test(i) for i in range(len(keys))]


class Recorder(L2AdapterListener):
    """An LMCache L2 listener that records what the adapter tells it, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, list[ObjectKey]]] = []

    def on_l2_keys_stored(self, keys: list[ObjectKey], sizes: list[int]) -> None:
        self.events.append(("stored", list(keys)))

    def on_l2_keys_accessed(self, keys: list[ObjectKey]) -> None:
        self.events.append(("accessed", list(keys)))

    def on_l2_keys_deleted(self, keys: list[ObjectKey]) -> None:
        self.events.append(("deleted", list(keys)))

    def of(self, kind: str) -> list[list[ObjectKey]]:
        return [keys for what, keys in self.events if what == kind]


def load(adapter: KvtierL2Adapter, keys: list[ObjectKey], objs: list[Any]) -> list[bool]:
    task = adapter.submit_load_task(keys, objs)
    bitmap = until(lambda: adapter.query_load_result(task), adapter.get_load_event_fd())
    return [bitmap.test(i) for i in range(len(keys))]


def fetch(
    adapter: KvtierL2Adapter, l1: L1MemoryManager, keys: list[ObjectKey]
) -> list[bytes | None]:
    """LMCache's prefetch order: lookup-and-lock, load the locked, unlock them."""
    locked = lock(adapter, keys)
    hit_keys = [k for k, flag in zip(keys, locked) if flag]
    out: dict[ObjectKey, bytes] = {}
    if hit_keys:
        bufs = objects(l1, len(hit_keys))
        for k, b, ok in zip(hit_keys, bufs, load(adapter, hit_keys, bufs)):
            if ok:
                out[k] = bytes(b.byte_array)
        adapter.submit_unlock(hit_keys)
        l1.free(bufs)
    return [out.get(k) for k in keys]
