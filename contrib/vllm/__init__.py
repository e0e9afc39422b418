"""kvtier below vLLM's CPU KV-cache tier.

vLLM (0.32 to 0.34) offloads KV cache through its ``OffloadingConnector`` and
``TieringOffloadingSpec``: a CPU *primary* tier that the engine copies blocks
to and from, and *secondary* tiers that receive every chunk stored in the
primary tier (cascade) and copy hits back into it (promotion).  This package
makes a kvtier chain one secondary tier:

``kvtier vllm-args tiers.yaml`` (:func:`kv_transfer_config`)
    prints the ``--kv-transfer-config`` JSON and the ``KVTransferConfig(...)``
    that switch it on.
:class:`~kvtier.contrib.vllm.spec.KvtierOffloadingSpec`
    the spec vLLM loads (``spec_name`` + ``spec_module_path``); it reads the
    chain's YAML from ``kvtier_config``, and also runs on vLLM's CPU platform.
:class:`~kvtier.contrib.vllm.tier.KvtierTier`
    the secondary tier: non-blocking lookups (batched per scheduler step,
    ``RETRY`` while pending), loads and stores straight on the rows of vLLM's
    host region, stats through vLLM's metrics.

The leading ``host`` tier
    vLLM's CPU tier already keeps blocks in RAM.  A chain that starts with a
    ``host`` tier therefore *sizes* vLLM's CPU tier (``cpu_bytes_to_use`` =
    the host tier's ``capacity``, ``eviction_policy`` = its ``eviction``;
    ``s3fifo`` and ``adaptive`` run as kvtier's own policies there,
    :mod:`kvtier.contrib.vllm.cache_policy`),
    and the chain opened for the secondary tier skips it: no block is held
    twice in RAM.  Without a leading host tier the CPU tier gets
    :data:`DEFAULT_PRIMARY_BYTES` (1 GiB) unless ``cpu_bytes_to_use`` is
    given.  The tiers below behave as write-through: vLLM hands every chunk
    it stores in its CPU tier to the secondary tier at once.

Importing this package does not import vLLM; the tier and spec classes load
vLLM when first used.  All vLLM-version specifics live in
:mod:`kvtier.contrib.vllm._compat`.

May import :mod:`kvtier.policies` (vLLM's CPU tier runs kvtier's
policies), :mod:`kvtier.block`, :mod:`kvtier.chain`, :mod:`kvtier.config`,
:mod:`kvtier.observe` (the phase timings of a load) and :mod:`kvtier.spec`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .args import (
    DEFAULT_PRIMARY_BYTES,
    SPEC_MODULE,
    SPEC_NAME,
    TIER_MODULE,
    TIER_TYPE,
    complete_extra_config,
    kv_transfer_config,
    primary_settings,
    secondary_chain_config,
    vllm_args_command,
)

if TYPE_CHECKING:
    from .spec import KvtierOffloadingSpec
    from .tier import KvtierTier, live_tiers
    from .worker import HostCopyWorker

__all__ = [
    "DEFAULT_PRIMARY_BYTES",
    "SPEC_MODULE",
    "SPEC_NAME",
    "TIER_MODULE",
    "TIER_TYPE",
    "HostCopyWorker",
    "KvtierOffloadingSpec",
    "KvtierTier",
    "complete_extra_config",
    "kv_transfer_config",
    "live_tiers",
    "primary_settings",
    "secondary_chain_config",
    "vllm_args_command",
]

_LAZY = {
    "KvtierOffloadingSpec": ".spec",
    "KvtierTier": ".tier",
    "live_tiers": ".tier",
    "HostCopyWorker": ".worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
