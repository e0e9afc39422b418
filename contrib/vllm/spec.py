"""``KvtierOffloadingSpec``: vLLM's tiered offloading with a kvtier chain below its CPU tier.

Loaded by vLLM from ``kv_connector_extra_config``::

    {"spec_name": "KvtierOffloadingSpec",
     "spec_module_path": "kvtier.contrib.vllm.spec",
     "kvtier_config": "/etc/kvtier/tiers.yaml"}

It is vLLM's ``TieringOffloadingSpec`` (CPU primary tier, secondary tiers
fed by cascades and read by promotions) with two additions:

* ``kvtier_config`` wires the chain in: a :class:`~kvtier.contrib.vllm.tier.KvtierTier`
  secondary tier is added unless one is listed, and ``cpu_bytes_to_use`` /
  ``eviction_policy`` come from the chain's leading ``host`` tier unless
  given (see :func:`~kvtier.contrib.vllm.args.complete_extra_config`).
* It also runs on vLLM's CPU platform: there :class:`~kvtier.contrib.vllm.worker.HostCopyWorker`
  copies between the engine's KV cache and the shared host region.  On CUDA
  and XPU, vLLM's own worker is used unchanged.
"""

from __future__ import annotations

from typing import Any

from ._compat import (
    CanonicalKVCaches,
    OffloadingMetricMetadata,
    OffloadingWorker,
    TieringOffloadingSpec,
    canonical_layout,
    has_device_worker,
    open_worker_region,
    with_extra_config,
)
from .args import complete_extra_config
from .worker import HostCopyWorker

__all__ = ["KvtierOffloadingSpec"]


class KvtierOffloadingSpec(TieringOffloadingSpec):  # type: ignore[misc, unused-ignore]
    """vLLM's tiering spec, wired to a kvtier chain, on GPU or CPU (see the module docstring)."""

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        definitions: dict[str, OffloadingMetricMetadata] = super().build_metric_definitions(
            complete_extra_config(extra_config)
        )
        return definitions

    def __init__(self, config: Any) -> None:
        super().__init__(with_extra_config(config, complete_extra_config(config.extra_config)))
        self._host_worker: HostCopyWorker | None = None

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if has_device_worker():
            return super().get_worker(kv_caches)
        if self._host_worker is None:
            if canonical_layout(self.config):
                raise ValueError(
                    "KvtierOffloadingSpec on the CPU platform copies the direct KV layout only; "
                    "remove 'canonical_layout' from kv_connector_extra_config"
                )
            region = open_worker_region(self)
            try:
                self._host_worker = HostCopyWorker(kv_caches, self.blocks_per_chunk, region)
            except BaseException:
                region.cleanup()
                raise
        return self._host_worker
