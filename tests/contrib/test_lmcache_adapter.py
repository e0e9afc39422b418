"""KvtierL2Adapter under LMCache 0.5.6: built by its plugin loader, driven with its MemoryObjs.

Every adapter here comes from LMCache's own ``--l2-adapter`` parsing and
factory (``parse_args_to_l2_adapters_config`` + ``create_l2_adapter``), and
every buffer from LMCache's L1 memory manager (its mixed host allocator).
Tiers are real: host RAM and fs in ``tmp_path``, the object tier on SeaweedFS.
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
from typing import Any

import pytest
import yaml

lmcache = pytest.importorskip(
    "lmcache.v1.distributed.l2_adapters",
    reason="lmcache is not installed (make venv installs lmcache==0.5.6)",
)

import torch  # noqa: E402  (after the skip: torch comes with lmcache's environment)
from click.testing import CliRunner  # noqa: E402
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey  # noqa: E402
from lmcache.v1.distributed.config import L1MemoryManagerConfig  # noqa: E402
from lmcache.v1.distributed.l2_adapters import create_l2_adapter  # noqa: E402
from lmcache.v1.distributed.l2_adapters.config import (  # noqa: E402
    add_l2_adapters_args,
    parse_args_to_l2_adapters_config,
)
from lmcache.v1.distributed.memory_manager.l1_memory_manager import (  # noqa: E402
    L1MemoryManager,
)

from kvtier.cli import cli  # noqa: E402
from kvtier.contrib.lmcache import KvtierL2Adapter, KvtierL2AdapterConfig, kvtier_key  # noqa: E402
from kvtier.contrib.lmcache.args import l2_adapter_spec  # noqa: E402

MODEL = "tiny/llama"
# one LMCache chunk: (kv, layers, tokens, hidden) in bf16 = 16 KiB
LAYOUT = MemoryLayoutDesc(shapes=[torch.Size([2, 2, 32, 64])], dtypes=[torch.bfloat16])
CHUNK = 2 * 2 * 32 * 64 * 2
DESCS = {0: LAYOUT}
WAIT_S = 30.0


# --- LMCache-side helpers -------------------------------------------------------------
@pytest.fixture
def l1() -> Iterator[L1MemoryManager]:
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


@pytest.fixture
def adapter_of() -> Iterator[Callable[..., KvtierL2Adapter]]:
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


def lock(adapter: KvtierL2Adapter, keys: list[ObjectKey]) -> list[bool]:
    task = adapter.submit_lookup_and_lock_task(keys, DESCS)
    bitmap = until(lambda: adapter.query_lookup_and_lock_result(task),
                   adapter.get_lookup_and_lock_event_fd())
    return [bitmap.test(i) for i in range(len(keys))]


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


# --- loading and configuration --------------------------------------------------------------
def test_lmcache_plugin_loader_builds_the_adapter(tmp_path: Path, adapter_of: Any) -> None:
    adapter = adapter_of(host_fs(tmp_path))
    assert isinstance(adapter.settings, object) and adapter.chain.namespace.model == "lmcache"
    fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(),
           adapter.get_load_event_fd()}
    assert len(fds) == 3 and all(fd >= 0 for fd in fds)
    assert not adapter.supports_global_eviction  # the chain's tiers evict by themselves
    assert [t.name for t in adapter.chain.tiers] == ["ram", "disk"]


def test_bad_chain_yaml_stops_lmcache_at_start_up(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("chain:\n  - name: ram\n    backend: host\n    capacity: lots\n")
    with pytest.raises(ValueError, match=r"bad\.yaml:4.*capacity"):
        build({"kvtier_config": str(bad)})
    with pytest.raises(ValueError, match="no such file"):
        build({"kvtier_config": str(tmp_path / "missing.yaml")})
    with pytest.raises(ValueError, match="unknown adapter_params"):
        build({"kvtier_config": host_fs(tmp_path), "kvtier_confg": "x"})
    with pytest.raises(ValueError, match="lock_copies"):
        build({"kvtier_config": host_fs(tmp_path), "lock_copies": "some"})


def test_lmcache_args_prints_a_flag_lmcache_accepts(tmp_path: Path, adapter_of: Any) -> None:
    path = host_fs(tmp_path)
    result = CliRunner().invoke(cli, ["lmcache-args", path, "--json-only"])
    assert result.exit_code == 0, result.output
    spec = json.loads(result.output)
    assert spec == l2_adapter_spec(path)
    assert spec["adapter_params"]["kvtier_config"] == os.path.abspath(path)
    adapter = build(spec["adapter_params"])
    adapter.close()
    full = CliRunner().invoke(cli, ["lmcache-args", path])
    assert "--l2-adapter '" in full.output
    (tmp_path / "bad.yaml").write_text("chain: [{name: x, backend: nosuch}]\n")
    bad = CliRunner().invoke(cli, ["lmcache-args", str(tmp_path / "bad.yaml")])
    assert bad.exit_code == 2 and "nosuch" in bad.output


def test_config_class_is_found_by_lmcache_convention(tmp_path: Path) -> None:
    cfg = KvtierL2AdapterConfig.from_dict({"kvtier_config": host_fs(tmp_path)})
    assert cfg.settings.max_locked_bytes == 1 << 30 and "kvtier_config" in cfg.help()


# --- data path ------------------------------------------------------------------------
def test_round_trip_byte_for_byte(tmp_path: Path, adapter_of: Any, l1: Any) -> None:
    adapter = adapter_of(host_fs(tmp_path))
    keys = [okey(i) for i in range(8)]
    objs = objects(l1, 8)
    assert objs[0].get_size() == CHUNK
    data = fill(objs, seed=1)
    result = store(adapter, keys, objs)
    assert result.is_successful() and result.bytes_transferred() == 8 * CHUNK
    assert fetch(adapter, l1, keys) == data
    adapter.chain.flush()
    adapter.chain.tiers[0].evict([kvtier_key(k) for k in keys])  # now only in fs
    assert fetch(adapter, l1, keys) == data
    status = adapter.report_status()
    assert status["is_healthy"] and status["pinned_keys"] == 0 and status["copied_bytes"] == 0


def test_partial_hits_are_exact(tmp_path: Path, adapter_of: Any, l1: Any) -> None:
    adapter = adapter_of(host_fs(tmp_path))
    keys = [okey(i) for i in range(8)]
    objs = objects(l1, 4)
    data = fill(objs, seed=2)
    store(adapter, [keys[1], keys[2], keys[5], keys[7]], objs)
    assert lock(adapter, keys) == [False, True, True, False, False, True, False, True]
    bufs = objects(l1, 8)
    assert load(adapter, keys, bufs) == [False, True, True, False, False, True, False, True]
    assert [bytes(bufs[i].byte_array) for i in (1, 2, 5, 7)] == data
    adapter.submit_unlock([keys[i] for i in (1, 2, 5, 7)])


def test_corrupt_block_is_a_counted_miss(tmp_path: Path, adapter_of: Any, l1: Any) -> None:
    path = write_yaml(tmp_path / "tiers.yaml", [
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/fs"}])
    adapter = adapter_of(path)
    keys = [okey(i) for i in range(3)]
    objs = objects(l1, 3)
    data = fill(objs, seed=3)
    store(adapter, keys, objs)
    victim = kvtier_key(keys[1]).hex()
    (file,) = [p for p in (tmp_path / "fs").rglob("*.kvb") if p.name.startswith(victim)]
    raw = bytearray(file.read_bytes())
    raw[-100] ^= 0x01
    file.write_bytes(bytes(raw))
    assert fetch(adapter, l1, keys) == [data[0], None, data[2]]
    assert adapter.chain.stats()["tiers"][0]["corrupt"] == 1
    assert adapter.report_status()["load_misses"] == 1


def test_salts_never_share_a_block(tmp_path: Path, adapter_of: Any, l1: Any) -> None:
    adapter = adapter_of(host_fs(tmp_path))
    alice, bob = okey(7, salt="alice"), okey(7, salt="bob")
    assert alice.chunk_hash == bob.chunk_hash and kvtier_key(alice) != kvtier_key(bob)
    objs = objects(l1, 2)
    data = fill(objs, seed=4)
    store(adapter, [alice], objs[:1])
    assert lock(adapter, [bob, okey(7)]) == [False, False]
    store(adapter, [bob], objs[1:])
    assert fetch(adapter, l1, [alice, bob]) == data
    # every other field of the key separates blocks too
    others = [okey(7, salt="alice", rank=1), okey(7, salt="alice", group=1),
              okey(7, salt="alice", model="other/model")]
    assert lock(adapter, others) == [False, False, False]


def test_long_model_names_get_digested_keys(tmp_path: Path, adapter_of: Any, l1: Any) -> None:
    adapter = adapter_of(host_fs(tmp_path))
    long_a, long_b = okey(1, model="m" * 80), okey(1, model="m" * 79 + "n")
    assert len(kvtier_key(long_a)) <= 64 and kvtier_key(long_a) != kvtier_key(long_b)
    objs = objects(l1, 1)
    data = fill(objs, seed=5)
    store(adapter, [long_a], objs)
    assert fetch(adapter, l1, [long_a, long_b]) == [data[0], None]


def test_eventfds_signal_each_completion_once(tmp_path: Path, adapter_of: Any, l1: Any) -> None:
    adapter = adapter_of(host_fs(tmp_path))
    keys = [okey(i) for i in range(2)]
    objs = objects(l1, 2)
    fill(objs, seed=6)
    task = adapter.submit_store_task(keys, objs)
    wait_fd(adapter.get_store_event_fd())
    done = adapter.pop_completed_store_tasks()
    assert set(done) == {task} and done[task].is_successful()
    assert adapter.pop_completed_store_tasks() == {}  # popped once
    lookup = adapter.submit_lookup_and_lock_task(keys, DESCS)
    wait_fd(adapter.get_lookup_and_lock_event_fd())
    assert adapter.query_lookup_and_lock_result(lookup) is not None
    assert adapter.query_lookup_and_lock_result(lookup) is None  # not idempotent, as specified
    bufs = objects(l1, 2)
    loading = adapter.submit_load_task(keys, bufs)
    wait_fd(adapter.get_load_event_fd())
    assert adapter.query_load_result(loading) is not None
    adapter.submit_unlock(keys)
    # nothing outstanding: no fd is readable
    poller = select.poll()
    for fd in (adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(),
               adapter.get_load_event_fd()):
        poller.register(fd, select.POLLIN)
    assert poller.poll(50) == []


# --- locks ----------------------------------------------------------------------------
def test_locked_ram_block_survives_eviction_until_unlock(
    tmp_path: Path, adapter_of: Any, l1: Any
) -> None:
    path = write_yaml(tmp_path / "tiers.yaml", [
        {"name": "ram", "backend": "host", "capacity": 5 * CHUNK - 1}])  # 4 framed blocks
    adapter = adapter_of(path)
    keys = [okey(i) for i in range(12)]
    objs = objects(l1, 12)
    data = fill(objs, seed=7)
    store(adapter, keys[:4], objs[:4])
    assert lock(adapter, keys[:2]) == [True, True]
    assert lock(adapter, keys[:1]) == [True]  # locked twice: needs two unlocks
    store(adapter, keys[4:], objs[4:])  # evicts everything stored before from the RAM tier
    assert adapter.chain.lookup([kvtier_key(k) for k in keys[:4]]) == [None] * 4
    bufs = objects(l1, 2)
    assert load(adapter, keys[:2], bufs) == [True, True]
    assert [bytes(b.byte_array) for b in bufs] == data[:2]
    assert adapter.report_status()["copied_bytes"] == 2 * CHUNK
    adapter.submit_unlock(keys[:2])
    assert adapter.report_status()["copied_bytes"] == CHUNK  # key 0 still locked once
    assert load(adapter, keys[:2], bufs) == [True, False]
    adapter.submit_unlock(keys[:1])
    assert adapter.report_status()["copied_bytes"] == 0
    assert load(adapter, keys[:1], bufs) == [False]


def test_lock_copies_are_bounded(tmp_path: Path, adapter_of: Any, l1: Any) -> None:
    path = write_yaml(tmp_path / "tiers.yaml", [
        {"name": "ram", "backend": "host", "capacity": 1 << 20}])
    adapter = adapter_of(path, max_locked_bytes=2 * CHUNK)
    keys = [okey(i) for i in range(3)]
    objs = objects(l1, 3)
    fill(objs, seed=8)
    store(adapter, keys, objs)
    assert lock(adapter, keys) == [True, True, False]  # the third would pass the bound
    assert adapter.report_status()["lock_over_budget"] == 1
    adapter.submit_unlock(keys[:2])
    assert lock(adapter, keys[2:]) == [True]
    adapter.submit_unlock(keys[2:])


def test_delete_of_a_locked_block_waits_for_unlock(
    tmp_path: Path, adapter_of: Any, l1: Any
) -> None:
    path = write_yaml(tmp_path / "tiers.yaml", [
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/fs"}])
    adapter = adapter_of(path)
    keys = [okey(i) for i in range(2)]
    objs = objects(l1, 2)
    data = fill(objs, seed=9)
    store(adapter, keys, objs)
    assert lock(adapter, keys[:1]) == [True]
    adapter.delete(keys)  # LMCache's eviction: key 1 goes now, key 0 at unlock
    bufs = objects(l1, 1)
    assert load(adapter, keys[:1], bufs) == [True] and bytes(bufs[0].byte_array) == data[0]
    kv = [kvtier_key(k) for k in keys]
    deadline = time.monotonic() + WAIT_S
    while adapter.chain.lookup(kv) != [0, None] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert adapter.chain.lookup(kv) == [0, None]
    adapter.submit_unlock(keys[:1])
    while adapter.chain.lookup(kv[:1]) != [None] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert adapter.chain.lookup(kv[:1]) == [None]


# --- concurrency and faults -------------------------------------------------------------------
def test_store_and_prefetch_threads_at_once(tmp_path: Path, adapter_of: Any, l1: Any) -> None:
    """LMCache calls from a store and a prefetch thread; here from four of each kind."""
    adapter = adapter_of(host_fs(tmp_path, ram=24 * CHUNK))
    errors: list[BaseException] = []
    lock_l1 = threading.Lock()

    def worker(t: int) -> None:
        try:
            for round_ in range(6):
                keys = [okey(1000 * t + 10 * round_ + i) for i in range(4)]
                with lock_l1:
                    objs = objects(l1, 4)
                data = fill(objs, seed=100 * t + round_)
                assert store(adapter, keys, objs).is_successful()
                with lock_l1:
                    l1.free(objs)
                got = fetch(adapter, l1, keys)
                assert got == data, f"thread {t} round {round_}"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    assert adapter.report_status()["pinned_keys"] == 0


def test_object_tier_round_trip(
    tmp_path: Path, adapter_of: Any, l1: Any, s3_server: Any, bucket: str
) -> None:
    path = write_yaml(tmp_path / "tiers.yaml", [
        {"name": "ram", "backend": "host", "capacity": 1 << 20},
        {"name": "s3", "backend": "object", "bucket": bucket, "endpoint": s3_server.endpoint,
         "access_key_id": s3_server.access_key, "secret_access_key": s3_server.secret_key,
         "region": s3_server.region},
    ])
    adapter = adapter_of(path)
    keys = [okey(i, salt="tenant-1") for i in range(6)]
    objs = objects(l1, 6)
    data = fill(objs, seed=10)
    store(adapter, keys, objs)
    adapter.chain.flush()
    adapter.chain.tiers[0].evict([kvtier_key(k) for k in keys])
    assert adapter.chain.lookup([kvtier_key(k) for k in keys]) == [1] * 6
    assert fetch(adapter, l1, keys) == data


def test_object_tier_killed_mid_run_gives_misses(
    tmp_path: Path, adapter_of: Any, l1: Any
) -> None:
    from seaweed import SeaweedServer

    server = SeaweedServer(tmp_path / "weed")
    server.start()
    try:
        bucket = server.make_bucket("kvt-lmcache-kill")
        path = write_yaml(tmp_path / "tiers.yaml", [
            {"name": "ram", "backend": "host", "capacity": 4 * CHUNK - 1},  # 3 framed blocks
            {"name": "s3", "backend": "object", "bucket": bucket, "endpoint": server.endpoint,
             "access_key_id": server.access_key, "secret_access_key": server.secret_key,
             "region": server.region, "connect_timeout": "1s", "request_timeout": "3s",
             "lookup_cache_ttl": "0s"},
        ])
        adapter = adapter_of(path)
        keys = [okey(i) for i in range(6)]
        objs = objects(l1, 6)
        data = fill(objs, seed=11)
        store(adapter, keys, objs)
        adapter.chain.flush()
        server.kill()
        # the RAM tier still holds the last three; the rest were only in the object tier
        got = fetch(adapter, l1, keys)
        assert got[3:] == data[3:] and got[:3] == [None] * 3
        more = objects(l1, 2)
        fill(more, seed=12)
        store(adapter, [okey(50), okey(51)], more)  # completes (RAM took them), no exception
        assert fetch(adapter, l1, [okey(50)])[0] == bytes(more[0].byte_array)
        tiers = adapter.chain.stats()["tiers"]
        assert not tiers[1]["healthy"] and adapter.report_status()["is_healthy"]
    finally:
        server.stop()


def test_usage_comes_from_the_chain(tmp_path: Path, adapter_of: Any, l1: Any) -> None:
    path = write_yaml(tmp_path / "tiers.yaml", [
        {"name": "ram", "backend": "host", "capacity": 1 << 20}])
    adapter = adapter_of(path)
    assert adapter.get_usage().total_bytes_used == 0
    objs = objects(l1, 4)
    fill(objs, seed=13)
    store(adapter, [okey(i) for i in range(4)], objs)
    usage = adapter.get_usage()
    backend = adapter.chain.stats()["tiers"][0]["backend_stats"]
    assert usage.total_bytes_used == backend["used_bytes"] >= 4 * CHUNK
    assert usage.total_capacity_bytes == 1 << 20
    assert usage.usage_fraction == backend["used_bytes"] / (1 << 20)
    fs_only = adapter_of(write_yaml(tmp_path / "fs.yaml", [
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/fs2"}]))
    assert fs_only.get_usage().total_capacity_bytes == 0  # unbounded tier: unknown capacity


# --- LMCache's own storage manager (the core of its multiprocess server) ------------------------
def test_lmcache_storage_manager_stores_and_prefetches_through_kvtier(tmp_path: Path) -> None:
    """L1 write -> LMCache's store controller -> kvtier; L1 dropped; its prefetch controller
    looks up, locks, loads from kvtier into L1 and unlocks.  Nothing of the adapter is called
    by the test: LMCache's controller threads poll its eventfds."""
    from lmcache.v1.distributed.api import GroupedObjectKeys, PrefetchTaskSpec
    from lmcache.v1.distributed.config import parse_args
    from lmcache.v1.distributed.storage_manager import StorageManager

    spec = l2_adapter_spec(host_fs(tmp_path, ram=3 * CHUNK), namespace=MODEL)
    config = parse_args(["--l1-size-gb", "0.05", "--eviction-policy", "LRU", "--no-l1-use-lazy",
                         "--l2-adapter", json.dumps(spec)])
    config.l1_manager_config.memory_config.shm_name = ""  # no POSIX shm segment in tests
    manager = StorageManager(config)
    try:
        ((_, adapter),) = manager.l2_adapters()
        assert isinstance(adapter, KvtierL2Adapter)
        keys = [okey(i, salt="s1") for i in range(6)]
        reserved = manager.reserve_write(keys, LAYOUT)
        assert list(reserved) == keys
        data = dict(zip(keys, fill([reserved[k] for k in keys], seed=14)))
        manager.finish_write(keys)
        kv = [kvtier_key(k) for k in keys]
        deadline = time.monotonic() + WAIT_S
        while None in adapter.chain.lookup(kv) and time.monotonic() < deadline:
            time.sleep(0.02)
        adapter.chain.flush()
        assert None not in adapter.chain.lookup(kv)  # RAM holds the last few, fs all
        assert manager.delete_l1_keys(keys, force=True) == (6, 0)
        wanted = [*keys, okey(99, salt="s1")]  # a chunk nobody stored ends the prefix
        handle = manager.submit_prefetch_task(PrefetchTaskSpec(key_groups=[
            GroupedObjectKeys(keys=wanted, object_group_id=0, layout_desc=LAYOUT)]))
        assert manager.wait_prefetch_status(handle, WAIT_S)
        result = manager.query_prefetch_status(handle)
        assert result is not None
        hits = result.l2_hit_cells[0]
        assert [hits.test(i) for i in range(7)] == [True] * 6 + [False]
        with manager.read_prefetched_results(keys, result.l1_owners) as objs:
            assert objs is not None
            assert [bytes(o.byte_array) for o in objs] == [data[k] for k in keys]
        status = adapter.report_status()
        assert status["pinned_keys"] == 0 and status["copied_bytes"] == 0  # LMCache unlocked
        assert status["load_hits"] == 6 and status["store_failures"] == 0
    finally:
        manager.close()


# --- LMCache's multiprocess server, run for real on the CPU ---------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _lmcache_server(tmp_path: Path, spec: dict[str, Any]) -> Any:
    """``lmcache server`` (MP mode, CPU) on loopback, telemetry off, with one --l2-adapter."""
    import subprocess
    import sys

    from server_process import ServerProcess

    class LMCacheServer(ServerProcess):
        def __init__(self) -> None:
            self.log_path = tmp_path / "lmcache-server.log"
            self.http = f"http://127.0.0.1:{_free_port()}"

        def start(self) -> None:
            command = [
                str(Path(sys.executable).with_name("lmcache")), "server",
                "--host", "127.0.0.1", "--port", str(_free_port()),
                "--http-host", "127.0.0.1", "--http-port", self.http.rsplit(":", 1)[1],
                "--l1-size-gb", "0.05", "--eviction-policy", "LRU", "--no-l1-use-lazy",
                "--disable-observability", "--l2-adapter", json.dumps(spec),
            ]
            env = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "LMCACHE_DISABLE_BANNER": "1"}
            with open(self.log_path, "wb") as log:
                self._track(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             env=env, cwd=tmp_path))

    return LMCacheServer()


def _get_json(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_lmcache_mp_server_runs_with_the_adapter_on_cpu(tmp_path: Path) -> None:
    server = _lmcache_server(tmp_path, l2_adapter_spec(host_fs(tmp_path)))
    server.start()
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.running, server.log_path.read_text()[-3000:]
            try:
                if _get_json(f"{server.http}/healthcheck") == {"status": "healthy"}:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "lmcache server did not come up"
            time.sleep(0.5)
        status = _get_json(f"{server.http}/status")
        (l2,) = status["storage_manager"]["l2_adapters"]
        assert l2["type"] == "KvtierL2Adapter" and l2["is_healthy"]
        assert [t["name"] for t in l2["tiers"]] == ["ram", "disk"]
        assert status["storage_manager"]["store_controllers"]["_default"]["num_l2_adapters"] == 1
    finally:
        server.stop()


def test_lmcache_mp_server_refuses_a_bad_chain_at_start_up(tmp_path: Path) -> None:
    good = host_fs(tmp_path)
    spec = l2_adapter_spec(good)
    Path(good).write_text("chain:\n  - {name: ram, backend: host, capacity: -5}\n")
    server = _lmcache_server(tmp_path, spec)
    server.start()
    try:
        assert server._proc.wait(120) != 0
        log = server.log_path.read_text()
        assert "tiers.yaml:2" in log and "capacity" in log
    finally:
        server.stop()
