"""KvtierL2Adapter under LMCache 0.5.6, driven directly: built by its plugin loader (loading and
configuration), its data path with LMCache's MemoryObjs, and its locks.

Every adapter here comes from LMCache's own ``--l2-adapter`` parsing and
factory, every buffer from LMCache's L1 memory manager (``lmcache_driver``).
Tiers are real: host RAM and fs in ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import select
import time
from pathlib import Path
from typing import Any

import pytest

lmcache = pytest.importorskip(
    "lmcache.v1.distributed.l2_adapters",
    reason="lmcache is not installed (make venv installs lmcache==0.5.6)",
)

from click.testing import CliRunner  # noqa: E402
from lmcache_driver import (  # noqa: E402
    CHUNK,
    DESCS,
    WAIT_S,
    Recorder,
    build,
    fetch,
    fill,
    host_fs,
    load,
    lock,
    objects,
    okey,
    store,
    wait_fd,
    write_yaml,
)

from kvtier.cli import cli  # noqa: E402
from kvtier.contrib.lmcache import KvtierL2AdapterConfig, kvtier_key  # noqa: E402
from kvtier.contrib.lmcache.args import l2_adapter_spec  # noqa: E402


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


def test_lookup_without_a_layout_hint_finds_the_ram_tier(
    tmp_path: Path, adapter_of: Any, l1: Any
) -> None:
    """LMCache calls the layout hint advisory: without it a RAM hit is still found, locked and
    copied, whether this adapter stored the block (its size is known) or not (read to learn it)."""
    path = write_yaml(tmp_path / "tiers.yaml", [
        {"name": "ram", "backend": "host", "capacity": 5 * CHUNK - 1}])  # 4 framed blocks
    adapter = adapter_of(path)
    keys = [okey(i) for i in range(8)]
    objs = objects(l1, 8)
    data = fill(objs, seed=15)
    store(adapter, keys[:2], objs[:2])
    adapter.chain.put([kvtier_key(keys[2])], [data[2]])  # in RAM, not stored by the adapter
    assert lock(adapter, keys[:4], descs={}) == [True, True, True, False]
    store(adapter, keys[4:], objs[4:])  # evicts everything stored before from the RAM tier
    assert adapter.chain.lookup([kvtier_key(k) for k in keys[:3]]) == [None] * 3
    bufs = objects(l1, 3)
    assert load(adapter, keys[:3], bufs) == [True] * 3
    assert [bytes(b.byte_array) for b in bufs] == data[:3]
    adapter.submit_unlock(keys[:3])
    assert adapter.report_status()["copied_bytes"] == 0


# --- deletes and usage ------------------------------------------------------------------
def test_delete_is_done_when_it_returns(tmp_path: Path, adapter_of: Any, l1: Any) -> None:
    """Once delete() returns, usage, lookups and LMCache's listeners agree the keys are gone,
    and listeners hear of exactly the keys that were removed."""
    path = write_yaml(tmp_path / "tiers.yaml", [
        {"name": "ram", "backend": "host", "capacity": 1 << 20}])
    adapter = adapter_of(path)
    heard = Recorder()
    adapter.register_listener(heard)
    keys = [okey(i) for i in range(4)]
    objs = objects(l1, 4)
    data = fill(objs, seed=16)
    store(adapter, keys, objs)
    assert heard.of("stored") == [keys]
    before = adapter.get_usage()
    adapter.delete([keys[0], okey(9), keys[1]])  # key 9 was never stored
    after = adapter.get_usage()
    assert heard.of("deleted") == [[keys[0], keys[1]]]
    assert after.total_bytes_used == before.total_bytes_used // 2 > 0
    assert dict(after.bytes_by_cache_salt) == {"": 2 * CHUNK}
    assert adapter.chain.lookup([kvtier_key(k) for k in keys]) == [None, None, 0, 0]
    assert fetch(adapter, l1, keys) == [None, None, *data[2:]]
    adapter.delete(keys[:2])  # gone already: nobody is told twice
    assert heard.of("deleted") == [[keys[0], keys[1]]]


def test_bytes_by_cache_salt_feed_lmcache_quotas(
    tmp_path: Path, adapter_of: Any, l1: Any
) -> None:
    """LMCache's per-salt quotas read ``bytes_by_cache_salt``: the bytes of each salt's chunks
    the adapter holds, counted once however often a chunk is stored, and dropped on delete."""
    adapter = adapter_of(host_fs(tmp_path))
    alice = [okey(i, salt="alice") for i in range(3)]
    bob = [okey(i, salt="bob") for i in range(2)]
    objs = objects(l1, 5)
    fill(objs, seed=17)
    assert dict(adapter.get_usage().bytes_by_cache_salt) == {}
    store(adapter, alice, objs[:3])
    store(adapter, bob, objs[3:])
    assert dict(adapter.get_usage().bytes_by_cache_salt) == {"alice": 3 * CHUNK, "bob": 2 * CHUNK}
    store(adapter, alice[:2], objs[:2])  # stored again: counted once
    assert dict(adapter.get_usage().bytes_by_cache_salt) == {"alice": 3 * CHUNK, "bob": 2 * CHUNK}
    adapter.delete(bob[:1])
    assert dict(adapter.get_usage().bytes_by_cache_salt) == {"alice": 3 * CHUNK, "bob": CHUNK}
    adapter.delete(bob)
    assert dict(adapter.get_usage().bytes_by_cache_salt) == {"alice": 3 * CHUNK}


def test_a_deleted_locked_key_stored_again_stays(
    tmp_path: Path, adapter_of: Any, l1: Any
) -> None:
    """A locked key's delete waits for its unlock to remove the block; a store of the key in
    between makes it held again, and the unlock removes nothing."""
    path = write_yaml(tmp_path / "tiers.yaml", [
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/fs"}])
    adapter = adapter_of(path)
    heard = Recorder()
    adapter.register_listener(heard)
    key = okey(3)
    objs = objects(l1, 1)
    data = fill(objs, seed=19)
    store(adapter, [key], objs)
    assert lock(adapter, [key]) == [True]
    adapter.delete([key])
    assert lock(adapter, [key]) == [False]
    store(adapter, [key], objs)
    adapter.submit_unlock([key])
    assert fetch(adapter, l1, [key]) == data
    assert [kind for kind, _ in heard.events if kind != "accessed"] == [
        "stored", "deleted", "stored"]
    assert dict(adapter.get_usage().bytes_by_cache_salt) == {"": CHUNK}
