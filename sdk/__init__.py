"""kvtier: a storage-backend SDK for LLM KV cache tiers.

Open a chain of tiers from a YAML file or a dict::

    import kvtier

    with kvtier.open_chain("tiers.yaml", namespace="my-model/bf16/b32") as chain:
        chain.put(keys, blocks)
        chain.get(keys, out)

May import :mod:`kvtier.block`, :mod:`kvtier.chain`, :mod:`kvtier.config`
and :mod:`kvtier.spec`, for the names it gathers here and for its own modules:
:mod:`.console` (where the commands print) and :mod:`.demo`.
"""

from __future__ import annotations

from kvtier.block.namespace import Namespace
from kvtier.chain.chain import Chain, JobResult, open_chain
from kvtier.spec import (
    CONTRACT_VERSION,
    BackendError,
    ClosedError,
    ConfigError,
    ContractError,
    KvtierError,
    PluginError,
)

__version__ = "0.1.0"

__all__ = [
    "CONTRACT_VERSION",
    "BackendError",
    "Chain",
    "ClosedError",
    "ConfigError",
    "ContractError",
    "JobResult",
    "KvtierError",
    "Namespace",
    "PluginError",
    "__version__",
    "open_chain",
]
