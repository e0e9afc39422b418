"""kvtier as an LMCache (0.5) multiprocess-mode L2 adapter.

LMCache's server loads L2 adapters from ``--l2-adapter`` JSON; its plugin
loader imports this package and builds :class:`KvtierL2Adapter`::

    lmcache server ... --l2-adapter '{"type": "plugin",
        "module_path": "kvtier.contrib.lmcache", "class_name": "KvtierL2Adapter",
        "adapter_params": {"kvtier_config": "/etc/kvtier/tiers.yaml"}}'

``kvtier lmcache-args tiers.yaml`` checks the YAML and prints that flag.
Importing this package does not import LMCache; the adapter module does.

May import :mod:`kvtier` (the chain), :mod:`kvtier.chain` (the tenants'
chains), :mod:`kvtier.block` (a tenant's name), :mod:`kvtier.config` and
:mod:`kvtier.spec`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .args import ADAPTER_CLASS, ADAPTER_MODULE, l2_adapter_spec, lmcache_args_command
from .keys import kvtier_key

if TYPE_CHECKING:
    from .adapter import KvtierL2Adapter, KvtierL2AdapterConfig

__all__ = [
    "ADAPTER_CLASS",
    "ADAPTER_MODULE",
    "KvtierL2Adapter",
    "KvtierL2AdapterConfig",
    "kvtier_key",
    "l2_adapter_spec",
    "lmcache_args_command",
]

_LAZY = ("KvtierL2Adapter", "KvtierL2AdapterConfig")


def __getattr__(name: str) -> Any:
    # LMCache's loader reads both classes with getattr(module, name)
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import adapter

    return getattr(adapter, name)
