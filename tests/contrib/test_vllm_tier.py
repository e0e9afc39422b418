"""kvtier's secondary tier for vLLM (``KvtierTier``), driven directly with a fake primary
region: lookups, stores and loads through a chain, damaged blocks, stats, unreachable storage."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_chain import SpecStub, damage_blocks, host_tier, write_yaml

from kvtier.spec import BackendError, ConfigError, hookimpl

# --------------------------------------------------------------------------- tier


ROW = 4096


def spec() -> SpecStub:
    """vLLM's offloading spec as the tier reads it: one group of two layers, 4 KiB rows."""
    return SpecStub(ROW, ("layers.0.attn", "layers.1.attn"))


@pytest.fixture
def tier_factory(tmp_path: Path) -> Iterator[Any]:
    pytest.importorskip("vllm")
    from kvtier.contrib.vllm.tier import KvtierTier

    tiers: list[Any] = []

    def make(chunks: int = 8, **kwargs: Any) -> tuple[Any, np.ndarray]:
        config = write_yaml(tmp_path / "tiers.yaml", [host_tier(), {
            "name": "disk", "backend": "fs", "url": str(tmp_path / "store")}])
        region = np.zeros((chunks, ROW), dtype=np.uint8)
        tier = KvtierTier(spec(), memoryview(region), "KvtierTier",
                          config=str(config), **kwargs)
        tiers.append(tier)
        return tier, region

    yield make
    for tier in tiers:
        tier.shutdown()


def finish(tier: Any, job_ids: set[int], timeout: float = 10.0) -> dict[int, Any]:
    """Poll like vLLM's scheduler until every job reported."""
    done: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while set(done) != job_ids:
        assert time.monotonic() < deadline, f"jobs {job_ids - set(done)} never finished"
        for res in tier.get_finished_jobs():
            done[res.job_id] = res
        time.sleep(0.005)
    return done


def resolve(tier: Any, keys: list[bytes], timeout: float = 10.0) -> list[Any]:
    """Look keys up like vLLM: RETRY until the batched chain lookup answers."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext

    ctx = ReqContext(req_id="r")
    deadline = time.monotonic() + timeout
    while True:
        answers = [tier.lookup(k, ctx) for k in keys]
        if LookupResult.RETRY not in answers:
            return answers
        assert time.monotonic() < deadline
        tier.on_schedule_end(ScheduleEndContext((), ()))
        time.sleep(0.005)


def job(job_id: int, keys: list[bytes], chunks: list[int], promotion: bool) -> Any:
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob

    return TransferJob(job_id, keys, np.array(chunks, dtype=np.int32), promotion,
                       ReqContext(req_id="r"))


def test_tier_lookup_store_load_through_a_chain(tier_factory: Any) -> None:
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    tier, region = tier_factory()
    keys = [bytes([i]) * 36 for i in range(3)]
    # first answer never blocks: RETRY, the chain is asked at the end of the step
    assert tier.lookup(keys[0], ReqContext(req_id="r")) is LookupResult.RETRY
    assert resolve(tier, keys) == [LookupResult.MISS] * 3
    for c in range(3):
        region[c] = c + 1
    tier.submit_store(job(1, keys, [0, 1, 2], False))
    stored = finish(tier, {1})[1]
    assert stored.success and stored.transfer_bytes == 3 * ROW
    # a key it holds is not stored again
    tier.submit_store(job(2, keys[:1], [0], False))
    assert finish(tier, {2})[2].success
    assert tier.adapter_stats()["store_keys:skipped"] == 1

    # a fresh tier on the same chain (a new process, in effect) finds them
    other, region2 = tier_factory()
    missing = b"\xee" * 36
    assert resolve(other, [*keys, missing]) == [LookupResult.HIT] * 3 + [LookupResult.MISS]
    other.submit_load(job(7, [keys[2], missing, keys[0]], [5, 6, 7], True))
    loaded = finish(other, {7})[7]
    assert not loaded.success
    assert list(loaded.successful_keys) == [keys[2], keys[0]]  # vLLM recomputes the rest
    assert (region2[5] == 3).all() and (region2[7] == 1).all()
    assert other.chain_stats()["tiers"][0]["hits"] == 2
    # the key that failed to load stays a miss for a while: no livelock on a bad block
    assert resolve(other, [missing]) == [LookupResult.MISS]
    assert other.has_pending_work() is False


def test_tier_replaces_a_damaged_block_when_it_is_stored_again(
    tier_factory: Any, tmp_path: Path
) -> None:
    from vllm.v1.kv_offload.base import LookupResult

    tier, region = tier_factory()
    key = b"d" * 36
    region[0] = 1
    tier.submit_store(job(1, [key], [0], False))
    assert finish(tier, {1})[1].success
    assert damage_blocks(tmp_path / "store") == 1

    other, region2 = tier_factory()
    assert resolve(other, [key]) == [LookupResult.HIT]  # lookups do not read blocks
    other.submit_load(job(2, [key], [1], True))
    failed = finish(other, {2})[2]
    assert not failed.success and failed.successful_keys is None
    assert other.chain_stats()["tiers"][0]["corrupt"] == 1
    # vLLM recomputes the chunk and stores it: the damaged block is replaced
    region2[2] = 7
    other.submit_store(job(3, [key], [2], False))
    assert finish(other, {3})[3].success
    # the chain dropped the rejected block itself: nothing was left for the adapter to evict
    assert other.adapter_stats().get("dropped_keys:failed_load", 0) == 0

    third, region3 = tier_factory()
    assert resolve(third, [key]) == [LookupResult.HIT]
    third.submit_load(job(4, [key], [3], True))
    assert finish(third, {4})[4].success and (region3[3] == 7).all()


@pytest.mark.parametrize("bad", [8, 9, -1])
def test_tier_fails_a_job_naming_a_chunk_outside_the_region(
    tier_factory: Any, tmp_path: Path, bad: int
) -> None:
    from vllm.v1.kv_offload.base import LookupResult

    from kvtier.chain.catalog import CATALOG_HEX

    tier, region = tier_factory(chunks=8)
    region[:] = 5
    keys = [b"a" * 36, b"b" * 36]
    tier.submit_store(job(1, keys, [0, bad], False))  # one good id does not save the job
    tier.submit_store(job(2, keys[:1], [bad], False))
    done = finish(tier, {1, 2})
    assert [done[i].success for i in (1, 2)] == [False, False]
    assert [done[i].transfer_bytes for i in (1, 2)] == [0, 0]
    tier.chain.flush()
    stored = [p for p in (tmp_path / "store").rglob("*.kvb") if CATALOG_HEX not in p.parts]
    assert stored == []
    other, region2 = tier_factory(chunks=8)
    assert resolve(other, keys) == [LookupResult.MISS, LookupResult.MISS]

    # a load naming such a chunk fails too, and leaves the region as it was
    tier.submit_store(job(3, keys[:1], [7], False))
    assert finish(tier, {3})[3].success
    tier.chain.flush()
    other.submit_load(job(4, keys[:1], [bad], True))
    loaded = finish(other, {4})[4]
    assert not loaded.success and loaded.transfer_bytes == 0
    assert not region2.any()
    other.submit_load(job(5, keys[:1], [0], True))  # the block itself was not blamed
    assert finish(other, {5})[5].success and (region2[0] == 5).all()


@pytest.mark.parametrize("portable", ["agnostic", "replicated"])
def test_tiers_of_other_tp_sizes_share_blocks_only_when_the_bytes_are_the_same(
    tmp_path: Path, portable: str
) -> None:
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.base import LookupResult

    from kvtier.contrib.vllm.tier import KvtierTier

    config = write_yaml(tmp_path / "tiers.yaml", [
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "store")}])
    tiers: list[Any] = []

    def tier(tp: int, same_bytes: bool = True, row: int = ROW) -> tuple[Any, np.ndarray]:
        flags = {"agnostic": same_bytes and portable == "agnostic",
                 "replicated": same_bytes and portable == "replicated"}
        region = np.zeros((4, row), dtype=np.uint8)
        stub = SpecStub(row, ("layers.0.attn", "layers.1.attn"), tp=tp, **flags)
        tiers.append(KvtierTier(stub, memoryview(region), "KvtierTier", config=str(config)))
        return tiers[-1], region

    try:
        keys = [b"p" * 36, b"q" * 36]
        for same_bytes in (True, False):  # vLLM says a row is the same bytes under any TP, or not
            writer, region = tier(2, same_bytes)
            region[0] = np.random.default_rng(len(tiers)).integers(0, 256, ROW, dtype=np.uint8)
            key = keys[same_bytes]
            writer.submit_store(job(1, [key], [0], False))
            assert finish(writer, {1})[1].success
            reader, region4 = tier(4, same_bytes)
            if not same_bytes:  # per-worker bytes: TP=4 rows are another namespace
                assert resolve(reader, [key]) == [LookupResult.MISS]
                assert reader.namespace.hex != writer.namespace.hex
                continue
            assert reader.namespace.hex == writer.namespace.hex
            assert resolve(reader, [key]) == [LookupResult.HIT]
            reader.submit_load(job(2, [key], [3], True))
            assert finish(reader, {2})[2].success
            assert bytes(region4[3]) == bytes(region[0])
            wider, _ = tier(4, same_bytes, row=2 * ROW)  # rows of another size never mix
            assert resolve(wider, [key]) == [LookupResult.MISS]
    finally:
        for t in tiers:
            t.shutdown()


def test_tier_hashes_long_keys_and_times_out_slow_lookups(tier_factory: Any) -> None:
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext

    from kvtier.contrib.vllm.tier import chain_key

    long_key = b"k" * 100
    assert len(chain_key(long_key)) == 32 and chain_key(b"k" * 64) == b"k" * 64
    tier, region = tier_factory()
    region[0] = 9
    tier.submit_store(job(1, [long_key], [0], False))
    assert finish(tier, {1})[1].success
    tier.submit_load(job(2, [long_key], [1], True))
    assert finish(tier, {2})[2].success and (region[1] == 9).all()

    slow, _ = tier_factory(lookup_timeout=0.0)
    ctx = ReqContext(req_id="r")
    assert slow.lookup(b"x" * 36, ctx) is LookupResult.RETRY
    time.sleep(0.01)  # never flushed to the chain: the answer is overdue
    assert slow.lookup(b"x" * 36, ctx) is LookupResult.MISS
    slow.on_schedule_end(ScheduleEndContext((), ()))
    assert slow.adapter_stats()["lookup_keys:timeout"] == 1


def test_tier_stats_match_its_metric_definitions(tier_factory: Any) -> None:
    from kvtier.contrib.vllm.tier import KvtierTier

    tier, _ = tier_factory()
    keys = [bytes([i]) * 36 for i in range(2)]
    resolve(tier, keys)
    tier.submit_store(job(1, keys, [0, 1], False))
    finish(tier, {1})
    tier.submit_load(job(2, keys, [2, 3], True))
    finish(tier, {2})
    stats = tier.get_stats()
    definitions = KvtierTier.build_metric_definitions({})
    reduced = stats.reduce()
    assert reduced["vllm:kv_offload_kvtier_hits:('disk',)"] == 2
    assert reduced["vllm:kv_offload_kvtier_store_keys:('ok',)"] == 2
    assert reduced["vllm:kv_offload_kvtier_load_keys:('ok',)"] == 2
    # vLLM's Prometheus logger rejects a metric it was not told about
    for name, by_label in stats.data["data"].items():
        assert name in definitions, name
        for labels in by_label:
            assert len(labels) == len(definitions[name].labelnames)
    assert tier.get_stats() is None  # nothing new


class OfflineAtFirst:
    """A dict backend whose storage is unreachable until ``online`` is set."""

    online = threading.Event()

    def __init__(self) -> None:
        self.blocks: dict[bytes, bytes] = {}

    @hookimpl
    def kvtier_open(self, options: Any, namespace: str) -> None:
        if not self.online.is_set():
            raise BackendError("connection refused")

    @hookimpl
    def kvtier_put(self, keys: Any, blocks: Any, evicted: Any) -> list[bool]:
        self.blocks.update((k, bytes(b)) for k, b in zip(keys, blocks))
        return [True] * len(keys)

    @hookimpl
    def kvtier_get(self, keys: Any) -> list[bytes | None]:
        return [self.blocks.get(k) for k in keys]

    @hookimpl
    def kvtier_lookup(self, keys: Any) -> list[bool]:
        return [k in self.blocks for k in keys]

    @hookimpl
    def kvtier_evict(self, keys: Any) -> list[bool]:
        return [self.blocks.pop(k, None) is not None for k in keys]


def test_ram_tier_serves_while_a_tier_below_cannot_open_and_that_tier_opens_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.base import LookupResult

    import kvtier.chain.health
    from kvtier.contrib.vllm.tier import KvtierTier
    from kvtier.plugins.registry import default_registry

    monkeypatch.setattr(kvtier.chain.health, "_BACKOFF_MAX", 0.2)  # retried soon once online
    default_registry().register("vllm-test-offline", OfflineAtFirst)
    config = write_yaml(tmp_path / "t.yaml", [host_tier(),
                                              {"name": "far", "backend": "vllm-test-offline"}])
    region = np.ones((4, ROW), np.uint8)
    tier = KvtierTier(spec(), memoryview(region), "KvtierTier", config=str(config),
                      keep_host_tier=True)
    try:
        key = b"o" * 36
        assert resolve(tier, [key]) == [LookupResult.MISS]
        tier.submit_store(job(1, [key], [0], False))
        assert finish(tier, {1})[1].success  # the RAM tier took it: the chain opened
        assert resolve(tier, [key]) == [LookupResult.HIT]
        ram, far = tier.chain_stats()["tiers"]
        assert ram["healthy"] and not far["healthy"] and "connection refused" in far["last_error"]
        assert far["puts"] == 0 and far["failed"] == 1  # written through: skipped, counted
        OfflineAtFirst.online.set()
        deadline = time.monotonic() + 10
        while not tier.chain_stats()["tiers"][1]["healthy"]:  # reopened in the background
            assert time.monotonic() < deadline
            time.sleep(0.01)
        other = b"p" * 36
        tier.submit_store(job(2, [other], [1], False))
        assert finish(tier, {2})[2].success
        tier.chain.flush()
        assert tier.chain_stats()["tiers"][1]["puts"] == 1  # the far tier takes writes now
    finally:
        tier.shutdown()
        OfflineAtFirst.online.clear()


def test_tier_starts_without_a_required_unreachable_tier_and_connects_later(
    tmp_path: Path,
) -> None:
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.base import LookupResult

    from kvtier.contrib.vllm.tier import KvtierTier
    from kvtier.plugins.registry import default_registry

    default_registry().register("vllm-test-offline", OfflineAtFirst)
    config = write_yaml(tmp_path / "t.yaml", [
        host_tier(), {"name": "far", "backend": "vllm-test-offline", "required": True}])
    region = np.ones((4, ROW), np.uint8)
    tier = KvtierTier(spec(), memoryview(region), "KvtierTier", config=str(config),
                      reopen_interval=0.0)
    try:
        key = b"o" * 36
        assert resolve(tier, [key]) == [LookupResult.MISS]  # no exception, only misses
        tier.submit_store(job(1, [key], [0], False))
        assert not finish(tier, {1})[1].success  # no chain: a required tier did not open
        OfflineAtFirst.online.set()
        deadline = time.monotonic() + 10
        while not tier.chain_stats()["tiers"]:  # reopened from on_schedule_end
            assert time.monotonic() < deadline
            resolve(tier, [os.urandom(36)])
            time.sleep(0.01)
        tier.submit_store(job(2, [key], [0], False))
        assert finish(tier, {2})[2].success
    finally:
        tier.shutdown()
        OfflineAtFirst.online.clear()


def test_tier_refuses_a_host_only_chain(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from kvtier.contrib.vllm.tier import KvtierTier

    config = write_yaml(tmp_path / "t.yaml", [host_tier()])
    with pytest.raises(ConfigError, match="only a host tier"):
        KvtierTier(spec(), memoryview(np.zeros((2, ROW), np.uint8)), "KvtierTier",
                   config=str(config))
