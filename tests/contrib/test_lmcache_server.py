"""KvtierL2Adapter inside LMCache 0.5.6 itself: its StorageManager's store and prefetch
controllers, and ``lmcache server`` in MP mode run for real on the CPU."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

lmcache = pytest.importorskip(
    "lmcache.v1.distributed.l2_adapters",
    reason="lmcache is not installed (make venv installs lmcache==0.5.6)",
)

from lmcache_driver import (  # noqa: E402
    CHUNK,
    LAYOUT,
    MODEL,
    WAIT_S,
    Recorder,
    fill,
    host_fs,
    okey,
)

from kvtier.contrib.lmcache import KvtierL2Adapter, kvtier_key  # noqa: E402
from kvtier.contrib.lmcache.args import l2_adapter_spec  # noqa: E402


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
        # what LMCache's quota endpoints report for each salt
        assert manager.get_usage_bytes_by_cache_salt() == {"s1": 6 * CHUNK}
        status = adapter.report_status()
        assert status["pinned_keys"] == 0 and status["copied_bytes"] == 0  # LMCache unlocked
        assert status["load_hits"] == 6 and status["store_failures"] == 0
    finally:
        manager.close()


def test_lmcache_per_salt_quota_evicts_through_kvtier(tmp_path: Path) -> None:
    """LMCache's IsolatedLRU eviction reads each salt's bytes from the adapter and deletes a
    salt over its quota down to it, through kvtier; a salt within its quota keeps everything."""
    from lmcache.v1.distributed.config import parse_args
    from lmcache.v1.distributed.storage_manager import StorageManager

    spec = {**l2_adapter_spec(host_fs(tmp_path), namespace=MODEL),
            "eviction": {"eviction_policy": "IsolatedLRU", "trigger_watermark": 1.0,
                         "eviction_ratio": 0.5}}
    config = parse_args(["--l1-size-gb", "0.05", "--eviction-policy", "LRU", "--no-l1-use-lazy",
                         "--l2-adapter", json.dumps(spec)])
    config.l1_manager_config.memory_config.shm_name = ""
    manager = StorageManager(config)
    try:
        ((_, adapter),) = manager.l2_adapters()
        heard = Recorder()
        adapter.register_listener(heard)
        manager.quota_manager.set_quota("alice", 3 * CHUNK)
        manager.quota_manager.set_quota("bob", 10 * CHUNK)
        alice = [okey(i, salt="alice") for i in range(4)]
        bob = [okey(i, salt="bob") for i in range(2)]
        for keys in (alice, bob):
            reserved = manager.reserve_write(keys, LAYOUT)
            fill([reserved[k] for k in keys], seed=len(keys))
            manager.finish_write(keys)
        deadline = time.monotonic() + WAIT_S
        while sum(map(len, heard.of("deleted"))) < 2:  # alice over 3 chunks: half evicted
            assert time.monotonic() < deadline, dict(adapter.get_usage().bytes_by_cache_salt)
            time.sleep(0.05)
        assert dict(adapter.get_usage().bytes_by_cache_salt) == {"alice": 2 * CHUNK,
                                                                  "bob": 2 * CHUNK}
        deleted = [k for keys in heard.of("deleted") for k in keys]
        assert len(deleted) == 2 and set(deleted) < set(alice)
        held = adapter.chain.lookup([kvtier_key(k) for k in alice + bob])
        assert [where is None for where in held] == [k in deleted for k in alice + bob]
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
