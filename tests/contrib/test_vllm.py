"""kvtier as vLLM's secondary KV tier (``kvtier.contrib.vllm``), on vLLM's CPU build.

The first tests drive the pieces directly: the settings for vLLM, the tier
with a fake primary region, the CPU copy worker with fake KV tensors.  The
rest run the real engine, each run in a fresh process (``vllm_runner.py``),
on a tiny random Llama built for the module, and compare greedy outputs with
a run without any connector:

* instance 1 stores two prompts (chain: host -> fs [-> object on SeaweedFS]);
* a fresh multi-process engine on instance 1's fs directory serves both
  prompts from it; then, blocks damaged on disk, it rejects them, recomputes,
  and stores the recomputed blocks in their place, which serve a third pass;
* instance 2 (its own fs directory, same bucket) serves them from the object
  tier; then, S3 server stopped, it keeps answering correctly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from kvtier.chain.catalog import CATALOG_HEX
from kvtier.spec import BackendError, ConfigError, hookimpl

SUPPORT = Path(__file__).parents[1] / "support"
REPO = Path(__file__).parents[2]
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
HAVE_OBJECT = (REPO / "backends" / "object.py").exists()
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed")

# 4 full blocks of 32 tokens and 4 more: 128 tokens can come from a tier
PROMPTS = {
    "p1": [(i * 37 + 11) % 500 + 3 for i in range(132)],
    "p2": [(i * 53 + 7) % 500 + 3 for i in range(132)],
    "p3": [(i * 71 + 5) % 500 + 3 for i in range(132)],
}
CACHED = 128
HOST_BYTES = 16 << 20


def write_yaml(path: Path, chain: list[dict[str, Any]], **top: Any) -> Path:
    path.write_text(yaml.safe_dump({"chain": chain, **top}, sort_keys=False))
    return path


def host_tier() -> dict[str, Any]:
    return {"name": "ram", "backend": "host", "capacity": HOST_BYTES, "eviction": "arc"}


# --------------------------------------------------------------------------- settings


def test_kv_transfer_config_sizes_vllm_cpu_tier_from_host_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvtier.contrib.vllm import (
        SPEC_MODULE,
        SPEC_NAME,
        TIER_MODULE,
        TIER_TYPE,
        kv_transfer_config,
    )

    path = write_yaml(tmp_path / "tiers.yaml", [host_tier(), {
        "name": "disk", "backend": "fs", "url": str(tmp_path / "store")}])
    monkeypatch.chdir(tmp_path)
    config = json.loads(json.dumps(kv_transfer_config("tiers.yaml")))  # JSON-clean
    assert config["kv_connector"] == "OffloadingConnector"
    assert config["kv_role"] == "kv_both"
    extra = config["kv_connector_extra_config"]
    assert extra["spec_name"] == SPEC_NAME == "KvtierOffloadingSpec"
    assert extra["spec_module_path"] == SPEC_MODULE
    assert extra["cpu_bytes_to_use"] == HOST_BYTES
    assert extra["eviction_policy"] == "arc"
    assert extra["kvtier_config"] == str(path)  # absolute: the engine may run elsewhere
    assert extra["secondary_tiers"] == [
        {"type": TIER_TYPE, "module_path": TIER_MODULE, "config": str(path)}
    ]
    assert kv_transfer_config(path, cpu_bytes_to_use=1 << 20)[
        "kv_connector_extra_config"]["cpu_bytes_to_use"] == 1 << 20


def test_vllm_args_command_prints_flag_and_python(tmp_path: Path) -> None:
    from kvtier.contrib.vllm import vllm_args_command

    path = write_yaml(tmp_path / "tiers.yaml", [host_tier(), {
        "name": "disk", "backend": "fs", "url": str(tmp_path / "store")}])
    result = CliRunner().invoke(vllm_args_command, [str(path)])
    assert result.exit_code == 0, result.output
    flag = next(line for line in result.output.splitlines()
                if line.startswith("--kv-transfer-config "))
    config = json.loads(flag.split(" ", 1)[1].strip("'"))
    extra = config["kv_connector_extra_config"]
    assert extra["spec_name"] == "KvtierOffloadingSpec"
    assert extra["spec_module_path"] == "kvtier.contrib.vllm.spec"
    assert extra["cpu_bytes_to_use"] == HOST_BYTES
    assert "KVTransferConfig(" in result.output
    assert "kv_connector='OffloadingConnector'" in result.output
    code = result.output[result.output.index("from vllm.config"):]
    namespace: dict[str, Any] = {}
    exec(code.replace("from vllm.config import KVTransferConfig", ""),
         {"KVTransferConfig": lambda **kw: kw}, namespace)
    assert namespace["kv_transfer_config"] == config

    only = CliRunner().invoke(vllm_args_command, [str(path), "--format", "json"])
    assert json.loads(only.output) == config

    bad = write_yaml(tmp_path / "bad.yaml", [host_tier()])
    refused = CliRunner().invoke(vllm_args_command, [str(bad)])
    assert refused.exit_code == 2
    assert "only a host tier" in refused.output


def test_chain_without_host_tier_gets_default_primary_size(tmp_path: Path) -> None:
    from kvtier.contrib.vllm import (
        DEFAULT_PRIMARY_BYTES,
        complete_extra_config,
        secondary_chain_config,
    )

    path = write_yaml(tmp_path / "t.yaml", [{"name": "disk", "backend": "fs",
                                             "url": str(tmp_path / "s")}])
    extra = complete_extra_config({"kvtier_config": str(path)})
    assert extra["cpu_bytes_to_use"] == DEFAULT_PRIMARY_BYTES
    assert [t["type"] for t in extra["secondary_tiers"]] == ["KvtierTier"]
    assert [t.name for t in secondary_chain_config(path).tiers] == ["disk"]
    # explicit settings win; a listed tier is completed, not duplicated
    extra = complete_extra_config({"cpu_bytes_to_use": 5, "secondary_tiers": [
        {"type": "KvtierTier", "config": str(path), "lookup_timeout": 1}]})
    assert extra["cpu_bytes_to_use"] == 5
    assert extra["secondary_tiers"] == [{"type": "KvtierTier", "config": str(path),
                                         "lookup_timeout": 1,
                                         "module_path": "kvtier.contrib.vllm.tier"}]
    with pytest.raises(ConfigError, match="kvtier_config"):
        complete_extra_config({"secondary_tiers": [{"type": "KvtierTier"}]})
    # no kvtier YAML at all: vLLM's own tiering settings, untouched
    plain = {"cpu_bytes_to_use": 5, "secondary_tiers": [{"type": "fs", "root_dir": "/x"}]}
    assert complete_extra_config(plain) == plain


def test_readme_example_gives_vllm_a_32gib_cpu_tier(tmp_path: Path) -> None:
    from kvtier.contrib.vllm import kv_transfer_config
    from kvtier.plugins.registry import default_registry

    if "object" not in default_registry().names():
        pytest.skip("the object backend is not installed")
    readme = (REPO / "contrib" / "vllm" / "README.md").read_text()
    (example,) = re.findall(r"```yaml\n(.*?)```", readme, flags=re.S)
    path = tmp_path / "tiers.yaml"
    path.write_text(example)
    extra = kv_transfer_config(path)["kv_connector_extra_config"]
    assert extra["cpu_bytes_to_use"] == 32 << 30 and extra["eviction_policy"] == "arc"


# --------------------------------------------------------------------------- tier


class FakeSpec:
    """What a secondary tier reads from vLLM's offloading spec."""

    def __init__(self, row: int) -> None:
        from vllm.v1.kv_offload.config import (
            OffloadingCacheConfig,
            OffloadingConfig,
            OffloadingGroupConfig,
            OffloadingModelConfig,
            OffloadingParallelConfig,
        )

        self.config = OffloadingConfig(
            groups=(OffloadingGroupConfig(32, ("layers.0.attn", "layers.1.attn"), 0),),
            worker_kv_bytes_per_block=row,
            enable_kv_cache_events=False,
            extra_config={},
            engine_id="test",
            model=OffloadingModelConfig(name="tiny", dtype="float32"),
            cache=OffloadingCacheConfig(tokens_per_hash=32, blocks_per_chunk=1),
            parallel=OffloadingParallelConfig(
                rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                is_parallelism_agnostic=True,
            ),
        )
        self.cpu_page_size_per_worker = row
        self.replicated_layout = False


ROW = 4096


@pytest.fixture
def tier_factory(tmp_path: Path) -> Iterator[Any]:
    pytest.importorskip("vllm")
    from kvtier.contrib.vllm.tier import KvtierTier

    tiers: list[Any] = []

    def make(chunks: int = 8, **kwargs: Any) -> tuple[Any, np.ndarray]:
        config = write_yaml(tmp_path / "tiers.yaml", [host_tier(), {
            "name": "disk", "backend": "fs", "url": str(tmp_path / "store")}])
        region = np.zeros((chunks, ROW), dtype=np.uint8)
        tier = KvtierTier(FakeSpec(ROW), memoryview(region), "KvtierTier",
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


def test_tier_starts_without_unreachable_storage_and_connects_later(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.base import LookupResult

    from kvtier.contrib.vllm.tier import KvtierTier
    from kvtier.plugins.registry import default_registry

    default_registry().register("vllm-test-offline", OfflineAtFirst)
    config = write_yaml(tmp_path / "t.yaml", [host_tier(),
                                              {"name": "far", "backend": "vllm-test-offline"}])
    region = np.ones((4, ROW), np.uint8)
    tier = KvtierTier(FakeSpec(ROW), memoryview(region), "KvtierTier", config=str(config),
                      reopen_interval=0.0)
    try:
        key = b"o" * 36
        assert resolve(tier, [key]) == [LookupResult.MISS]  # no exception, only misses
        tier.submit_store(job(1, [key], [0], False))
        assert not finish(tier, {1})[1].success
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
        KvtierTier(FakeSpec(ROW), memoryview(np.zeros((2, ROW), np.uint8)), "KvtierTier",
                   config=str(config))


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


# --------------------------------------------------------------------------- engine runs


def runner_env(multiprocess: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocess else "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    })
    return env


class Run:
    """One ``vllm_runner.py`` process, started at once; its stdout is read as it comes.

    ``until(kind)`` waits for the runner's next ``KVTIER-RUNNER <kind>`` line,
    so several runs can be started together and collected later.
    """

    def __init__(self, tmp: Path, model: str, *, config: Path | None = None,
                 phases: str = "", multiprocess: bool = False, pause: bool = False,
                 kv_events: bool = False) -> None:
        self.log = tmp / f"run-{uuid.uuid4().hex[:8]}.log"
        cmd = [sys.executable, str(SUPPORT / "vllm_runner.py"), "--model", model,
               "--prompts", json.dumps(PROMPTS)]
        if config is not None:
            cmd += ["--kvtier-config", str(config)]
        if phases:
            cmd += ["--phases", phases]
        if pause:
            cmd += ["--pause", "--reset-between"]
        if kv_events:
            cmd += ["--kv-events"]
        with open(self.log, "w") as stderr:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, text=True, cwd=tmp,
                                         env=runner_env(multiprocess))
        self.lines: list[str] = []
        self._seen = 0  # lines already searched by until()
        self._cond = threading.Condition()
        self._eof = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    @property
    def stdout(self) -> str:
        with self._cond:
            return "".join(self.lines)

    def until(self, kind: str, timeout: float = 420.0) -> str:
        prefix = f"KVTIER-RUNNER {kind} "
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(self._seen, len(self.lines)):
                    if self.lines[i].startswith(prefix):
                        self._seen = i + 1
                        return self.lines[i][len(prefix):]
                self._seen = len(self.lines)
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    break
                self._cond.wait(left)
        self.proc.kill()
        code = self.proc.wait()
        tail = self.stdout[-3000:] + self.log.read_text()[-4000:]
        raise AssertionError(f"runner ended ({code}) before {kind}:\n{tail}")

    def resume(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        payload: dict[str, Any] = json.loads(self.until("RESULT"))
        assert self.proc.wait(60) == 0, self.log.read_text()[-4000:]
        return payload

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def outputs(result: dict[str, Any], phase: int = 0) -> dict[str, list[int]]:
    return {r["prompt"]: r["ids"] for r in result["phases"][phase]["runs"]}


def cached(result: dict[str, Any], phase: int = 0) -> dict[str, int]:
    return {r["prompt"]: r["num_cached_tokens"] for r in result["phases"][phase]["runs"]}


def metric(result: dict[str, Any], phase: int, name: str) -> float:
    return float(result["phases"][phase]["metrics"].get(name, 0))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed")
    out = tmp_path_factory.mktemp("model") / "tiny-llama"
    subprocess.run([sys.executable, str(SUPPORT / "make_tiny_llama.py"), str(out)], check=True,
                   capture_output=True, env=runner_env(False))
    return str(out)


class Stored:
    """Instance 1's chain and run."""

    def __init__(self, base: Path, config: Path, local_config: Path,
                 object_tier: dict[str, Any] | None, result: dict[str, Any],
                 stdout: str) -> None:
        self.base, self.config, self.local_config = base, config, local_config
        self.object_tier, self.result, self.stdout = object_tier, result, stdout


@pytest.fixture(scope="module")
def first_runs(
    model_dir: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[dict[str, list[int]], Stored]]:
    """Run together: a run without connector (the baseline), and instance 1 storing
    p1 and p2 in its chain: host -> fs [-> object on SeaweedFS, written through]."""
    base = tmp_path_factory.mktemp("instance1")
    chain = [host_tier(), {"name": "disk", "backend": "fs", "url": str(base / "store")}]
    object_tier = None
    if HAVE_OBJECT:
        server = request.getfixturevalue("s3_server")
        bucket = server.make_bucket(f"kvt-vllm-{uuid.uuid4().hex[:12]}")
        object_tier = {
            "name": "object", "backend": "object", "write": "through", "bucket": bucket,
            "endpoint": server.endpoint, "region": server.region,
            "access_key_id": server.access_key, "secret_access_key": server.secret_key,
            "allow_http": True, "connect_timeout": "1s", "request_timeout": "5s",
        }
        chain.append(object_tier)
    config = write_yaml(base / "tiers.yaml", chain, metrics={"log_interval": "1s"})
    local = write_yaml(base / "local.yaml", chain[:2])
    runs = [Run(tmp_path_factory.mktemp("baseline"), model_dir, phases="p1,p2,p3"),
            Run(base, model_dir, config=config, phases="p1,p2")]
    try:
        baseline = outputs(runs[0].result())
        stored = Stored(base, config, local, object_tier, runs[1].result(), runs[1].stdout)
        yield baseline, stored
    finally:
        for run in runs:
            run.kill()


@pytest.fixture(scope="module")
def baseline(first_runs: tuple[dict[str, list[int]], Stored]) -> dict[str, list[int]]:
    """Greedy outputs of p1, p2, p3 without any connector."""
    return first_runs[0]


@pytest.fixture(scope="module")
def stored(first_runs: tuple[dict[str, list[int]], Stored]) -> Stored:
    return first_runs[1]


@needs_vllm
@pytest.mark.timeout(900)
def test_instance_stores_prompts_in_the_chain(stored: Stored,
                                              baseline: dict[str, list[int]]) -> None:
    result = stored.result
    assert outputs(result) == {"p1": baseline["p1"], "p2": baseline["p2"]}
    assert cached(result) == {"p1": 0, "p2": 0}
    assert metric(result, 0, "store_keys{ok}") == 8  # 4 full chunks per prompt
    assert metric(result, 0, "written_bytes{disk}") > 0
    (local,) = result["phases"][0]["local"]  # read from the live tier in the engine process
    assert list(local["chain"]) == (["disk", "object"] if stored.object_tier else ["disk"])
    assert local["chain"]["disk"]["puts"] == 8
    blocks = list((stored.base / "store" / local["namespace"]).rglob("*.kvb"))
    assert len(blocks) == 8
    # metrics.log_interval: the chain's line reaches vLLM's log; the RAM tier is vLLM's
    # own CPU tier now, so the chain behind vLLM starts at "disk"
    lines = [line for line in stored.stdout.splitlines() if "kvtier [" in line]
    assert lines and all("disk:" in line and "ram:" not in line for line in lines)


def damage_blocks(root: Path) -> int:
    """Flip one payload byte in every stored KV block file; how many were changed.

    The namespace descriptors of :mod:`kvtier.chain.catalog` are left alone: not KV.
    """
    count = 0
    for path in root.rglob("*.kvb"):
        if CATALOG_HEX in path.parts:
            continue
        data = bytearray(path.read_bytes())
        data[len(data) - 100] ^= 0xFF
        path.write_bytes(bytes(data))
        count += 1
    return count


@needs_vllm
@pytest.mark.timeout(900)
def test_fresh_multiprocess_engine_serves_from_kvtier_and_rejects_damage(
    stored: Stored, baseline: dict[str, list[int]], model_dir: str
) -> None:
    # instance 1 again, its local chain only: with the bucket behind the fs tier,
    # intact copies from S3 would stand in for the damaged blocks
    run = Run(stored.base, model_dir, config=stored.local_config,
              phases="p1,p2;p1,p2;p1,p2", multiprocess=True, pause=True)
    try:
        run.until("PAUSED")
        assert damage_blocks(stored.base / "store") == 8
        run.resume()
        run.until("PAUSED")
        run.resume()
        result = run.result()
    finally:
        run.kill()

    # phase 0: a new engine process; every full chunk came from the fs tier
    assert outputs(result, 0) == {"p1": baseline["p1"], "p2": baseline["p2"]}
    assert cached(result, 0) == {"p1": CACHED, "p2": CACHED}
    assert metric(result, 0, "hits{disk}") == 8
    assert metric(result, 0, "load_keys{ok}") == 8
    assert metric(result, 0, "corrupt_blocks{disk}") == 0
    # phase 1: vLLM's caches reset, blocks damaged on disk: rejected, recomputed
    assert outputs(result, 1) == {"p1": baseline["p1"], "p2": baseline["p2"]}
    assert cached(result, 1) == {"p1": 0, "p2": 0}
    assert metric(result, 1, "corrupt_blocks{disk}") >= 2
    assert metric(result, 1, "load_keys{failed}") >= 2
    assert metric(result, 1, "hits{disk}") == 8  # no damaged block was served
    assert metric(result, 1, "store_keys{ok}") == 8  # recomputed blocks replace them
    # phase 2: caches reset again; the replaced blocks serve both prompts
    assert outputs(result, 2) == {"p1": baseline["p1"], "p2": baseline["p2"]}
    assert cached(result, 2) == {"p1": CACHED, "p2": CACHED}
    # every damaged block left the chain: dropped when a read rejected it, or by
    # the adapter before the recomputed block was stored
    dropped = metric(result, 2, "dropped_keys{failed_load}")
    assert dropped + metric(result, 1, "corrupt_blocks{disk}") == 8
    assert metric(result, 2, "corrupt_blocks{disk}") == metric(result, 1, "corrupt_blocks{disk}")


@needs_vllm
@pytest.mark.skipif(not HAVE_OBJECT, reason="the object backend (backends/object.py) is missing")
@pytest.mark.timeout(900)
def test_second_instance_shares_through_object_store_and_survives_its_outage(
    stored: Stored, baseline: dict[str, list[int]], model_dir: str,
    request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    server = request.getfixturevalue("s3_server")
    assert stored.object_tier is not None
    config = write_yaml(tmp_path / "tiers.yaml", [
        host_tier(),
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "store")},  # its own, empty
        stored.object_tier,
    ])
    run = Run(tmp_path, model_dir, config=config, phases="p1,p2;p1,p3", pause=True)
    try:
        run.until("PAUSED")
        server.stop()
        run.resume()
        result = run.result()
    finally:
        run.kill()
        server.start()

    # phase 0: instance 2 finds instance 1's blocks in the bucket
    assert outputs(result, 0) == {"p1": baseline["p1"], "p2": baseline["p2"]}
    assert cached(result, 0) == {"p1": CACHED, "p2": CACHED}
    (local,) = result["phases"][0]["local"]
    assert local["chain"]["object"]["hits"] == 8
    assert local["chain"]["disk"]["hits"] == 0
    assert local["adapter"]["load_keys:ok"] == 8
    # phase 1: S3 is down; p1 comes from the fs tier (promoted there in phase 0),
    # p3 is new: its lookups and stores to S3 fail, vLLM recomputes, nothing raises
    assert outputs(result, 1) == {"p1": baseline["p1"], "p3": baseline["p3"]}
    assert cached(result, 1) == {"p1": CACHED, "p3": 0}
    (local,) = result["phases"][1]["local"]
    assert local["chain"]["disk"]["hits"] == 4
    assert local["chain"]["object"]["errors"] >= 1



@needs_vllm
@pytest.mark.timeout(900)
def test_kv_events_report_the_blocks_the_chain_stores(model_dir: str, tmp_path: Path) -> None:
    """With vLLM's KV events on, vLLM's scheduler takes from the tier one stored
    event per chunk the chain stored (counted as vLLM takes them)."""
    config = write_yaml(tmp_path / "tiers.yaml", [
        host_tier(), {"name": "disk", "backend": "fs", "url": str(tmp_path / "store")}])
    run = Run(tmp_path, model_dir, config=config, phases="p1,p2", kv_events=True)
    try:
        result = run.result()
    finally:
        run.kill()
    # 4 full chunks per prompt, each reported once, none removed
    assert metric(result, 0, "store_keys{ok}") == 8
    assert metric(result, 0, "kv_events{stored}") == 8
    assert metric(result, 0, "kv_events{removed}") == 0
    blocks = [p for p in (tmp_path / "store").rglob("*.kvb") if CATALOG_HEX not in p.parts]
    assert len(blocks) == 8  # beside them, the catalog's record of the namespace
