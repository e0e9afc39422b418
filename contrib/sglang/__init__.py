"""kvtier as SGLang's HiCache storage backend (its L3 tier).

SGLang 0.5.23 loads third-party HiCache storage through its
``StorageBackendFactory`` ("dynamic" backend)::

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.contrib.sglang", "class_name": "KvtierStorage",
        "kvtier_config": "/abs/tiers.yaml", "interface_v1": 1}'

``kvtier sglang-args tiers.yaml`` (:func:`sglang_args`) validates the chain and
prints these flags.  :class:`~kvtier.contrib.sglang.storage.KvtierStorage` is
the backend; importing this package does not import SGLang, the class loads
it when first used.

May import :mod:`kvtier` (the chain), :mod:`kvtier.block` (a tenant's name),
:mod:`kvtier.config` and :mod:`kvtier.spec`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .args import BACKEND_CLASS, BACKEND_MODULE, extra_config, sglang_args, sglang_args_command

if TYPE_CHECKING:
    from .storage import KvtierStorage

__all__ = [
    "BACKEND_CLASS",
    "BACKEND_MODULE",
    "KvtierStorage",
    "extra_config",
    "sglang_args",
    "sglang_args_command",
]


def __getattr__(name: str) -> Any:
    if name != "KvtierStorage":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .storage import KvtierStorage

    return KvtierStorage
