"""KvtierL2Adapter against what LMCache 0.5.6 expects of every L2 adapter (its interface's
docstrings and its own adapters' tests, rewritten here to drive kvtier): a store holds its
memory objects until its job completes, and ``get_usage()`` reports LMCache's figures.

``get_usage()``: ``total_bytes_used`` is the bytes of the objects stored, once each, so it
equals the sum of ``bytes_by_cache_salt``; ``total_capacity_bytes`` is the sum of the tiers'
capacities, 0 (LMCache's "unknown or unlimited") when a tier is unbounded.  kvtier's own
figures (framed blocks, one copy per tier) stay in ``report_status()``.
"""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest

lmcache = pytest.importorskip(
    "lmcache.v1.distributed.l2_adapters",
    reason="lmcache is not installed (make venv installs lmcache==0.5.6)",
)

import torch  # noqa: E402
from lmcache.v1.memory_allocators.ad_hoc_memory_allocator import (  # noqa: E402
    AdHocMemoryAllocator,
)
from lmcache_driver import (  # noqa: E402
    CHUNK,
    LAYOUT,
    WAIT_S,
    fetch,
    fill,
    objects,
    okey,
    store,
    until,
    write_yaml,
)

from kvtier.chain.listeners import ChainEvent  # noqa: E402
from kvtier.contrib.lmcache import kvtier_key  # noqa: E402


def _ram(tmp_path: Path, capacity: int = 1 << 20) -> str:
    return write_yaml(tmp_path / "ram.yaml", [
        {"name": "ram", "backend": "host", "capacity": capacity}])


def _ad_hoc(n: int, seed: int) -> list[Any]:
    """MemoryObjs as LMCache's own adapter tests make them: each owns its tensor, which is
    freed when the last reference to the object goes."""
    allocator = AdHocMemoryAllocator(device="cpu")
    out = []
    for _ in range(n):
        obj = allocator.allocate(LAYOUT.shapes, LAYOUT.dtypes)
        assert obj is not None
        out.append(obj)
    fill(out, seed=seed)
    return out


# --- a store holds its objects ------------------------------------------------------------
def test_a_store_holds_its_objects_until_its_job_completes(
    tmp_path: Path, adapter_of: Any, l1: Any
) -> None:
    """LMCache's tests hand ``submit_store_task`` objects they hold no reference to.  The
    adapter keeps each one until its job has read it; the store succeeds with the bytes the
    object held, and the adapter lets the object go once the job is done."""
    adapter = adapter_of(_ram(tmp_path), job_workers=1)
    gate, busy = threading.Event(), threading.Event()
    first = okey(0)

    def hold_the_worker(event: ChainEvent) -> None:  # runs on the only job thread
        if kvtier_key(first) in event.keys:
            busy.set()
            gate.wait(WAIT_S)

    adapter.chain.add_listener(hold_the_worker)
    objs = objects(l1, 1)
    fill(objs, seed=21)
    adapter.submit_store_task([first], objs)
    assert busy.wait(WAIT_S)  # the next job waits for the gate
    key = okey(1)
    (obj,) = _ad_hoc(1, seed=22)
    data = bytes(obj.byte_array)
    task = adapter.submit_store_task([key], [obj])
    alive = weakref.ref(obj)
    obj.ref_count_down()  # as LMCache's tests release it: the allocator's count, then the object
    del obj
    gc.collect()
    held = alive() is not None
    # freed memory is handed out again: what reuses it holds other bytes
    scribble = [torch.full(LAYOUT.shapes[0], 7.0, dtype=LAYOUT.dtypes[0]) for _ in range(64)]
    gate.set()
    done: dict[int, Any] = {}

    def popped() -> Any:
        done.update(adapter.pop_completed_store_tasks())
        return done.get(task)

    result = until(popped, adapter.get_store_event_fd())
    del scribble
    assert result.is_successful() and result.bytes_transferred() == CHUNK
    assert held, "the adapter dropped the object before its job ran"
    assert fetch(adapter, l1, [key]) == [data]
    gc.collect()
    assert alive() is None, "the adapter kept the object after its job completed"


# --- usage as LMCache reads it ------------------------------------------------------------
def test_usage_reports_the_capacity_of_a_chain_with_capacities(
    tmp_path: Path, adapter_of: Any, l1: Any
) -> None:
    """Every tier has a capacity: the chain's is their sum, and ``usage_fraction`` is the
    stored bytes over it (it was 0 and -1 with an fs tier under a capacity)."""
    ram, disk = 1 << 20, 4 << 20
    adapter = adapter_of(write_yaml(tmp_path / "tiers.yaml", [
        {"name": "ram", "backend": "host", "capacity": ram},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/fs", "capacity": disk},
    ]))
    assert [t.capabilities.capacity for t in adapter.chain.tiers] == [ram, disk]
    empty = adapter.get_usage()
    assert (empty.total_capacity_bytes, empty.usage_fraction) == (ram + disk, 0.0)
    objs = objects(l1, 4)
    fill(objs, seed=23)
    store(adapter, [okey(i) for i in range(4)], objs)
    usage = adapter.get_usage()
    assert usage.total_capacity_bytes == ram + disk
    assert usage.usage_fraction == 4 * CHUNK / (ram + disk)
    assert not adapter.supports_global_eviction  # LMCache still runs no eviction of its own
    unbounded = adapter_of(write_yaml(tmp_path / "unbounded.yaml", [
        {"name": "ram", "backend": "host", "capacity": ram},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/fs2"},
    ]))
    usage = unbounded.get_usage()
    assert (usage.total_capacity_bytes, usage.usage_fraction) == (0, -1.0)  # no bound


def test_total_bytes_used_is_the_bytes_stored_once_each(
    tmp_path: Path, adapter_of: Any, l1: Any
) -> None:
    """A chunk in two tiers, framed in each, counts once with its own size: the total is the
    sum over salts.  ``report_status()`` keeps each tier's bytes (frames, every copy)."""
    adapter = adapter_of(write_yaml(tmp_path / "tiers.yaml", [
        {"name": "ram", "backend": "host", "capacity": 1 << 20},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/fs"},
    ]))
    alice = [okey(i, salt="alice") for i in range(3)]
    bob = [okey(i, salt="bob") for i in range(2)]
    objs = objects(l1, 5)
    fill(objs, seed=24)
    store(adapter, alice, objs[:3])
    store(adapter, bob, objs[3:])
    store(adapter, alice[:2], objs[:2])  # stored again: still once
    adapter.chain.flush()
    usage = adapter.get_usage()
    assert dict(usage.bytes_by_cache_salt) == {"alice": 3 * CHUNK, "bob": 2 * CHUNK}
    assert usage.total_bytes_used == sum(usage.bytes_by_cache_salt.values()) == 5 * CHUNK
    status = adapter.report_status()
    chain = [t["backend_stats"]["used_bytes"] for t in adapter.chain.stats()["tiers"]]
    assert [t["used_bytes"] for t in status["tiers"]] == chain
    assert all(used > 5 * CHUNK for used in chain)  # each tier: five framed copies
    assert status["tier_used_bytes"] == sum(chain) > usage.total_bytes_used
    assert [t["capacity_bytes"] for t in status["tiers"]] == [1 << 20, None]
    adapter.delete(bob)
    usage = adapter.get_usage()
    assert usage.total_bytes_used == sum(usage.bytes_by_cache_salt.values()) == 3 * CHUNK
