"""The adapter's settings: ``adapter_params`` of the ``--l2-adapter`` JSON, checked.

Kept free of LMCache imports so ``kvtier lmcache-args`` can check a
configuration on a machine without LMCache; :mod:`.adapter` wraps
:class:`AdapterSettings` in the config class LMCache's plugin loader finds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtier.block.namespace import check_tenant
from kvtier.config import ChainConfig, load_config
from kvtier.config.units import parse_size
from kvtier.spec import KvtierError

from .prefixes import KeepPrefix, parse_keep_prefixes

__all__ = ["LOCK_COPIES", "AdapterSettings"]

#: ``ram``: a lock copies blocks held by non-persistent tiers (RAM, Redis)
#: into the adapter; ``all``: every locked block is copied.
LOCK_COPIES = ("ram", "all")

_KNOWN = ("kvtier_config", "namespace", "lock_copies", "max_locked_bytes", "job_workers",
          "tenants", "shared_tenants", "keep_prefixes", "chunk_size", "hash_algorithm")


@dataclass(frozen=True)
class AdapterSettings:
    """Validated ``adapter_params``; the chain's YAML is loaded and checked too."""

    kvtier_config: str
    chain: ChainConfig
    namespace: str | Mapping[str, Any] = "lmcache"
    lock_copies: str = "ram"
    max_locked_bytes: int = 1 << 30
    job_workers: int = 4
    #: None: no tenants (one namespace); "salt": a tenant per cache_salt; or salt -> tenant
    tenants: str | Mapping[str, str] | None = None
    shared_tenants: frozenset[str] = frozenset()
    #: named prefixes to keep (.keep), hashed as the server hashes tokens: its
    #: --chunk-size and --hash-algorithm (LMCache 0.5.6's defaults here)
    keep_prefixes: tuple[KeepPrefix, ...] = ()
    chunk_size: int = 256
    hash_algorithm: str = "blake3"

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> AdapterSettings:
        """Check ``params``; raises ``ValueError`` naming the bad key (LMCache reports it)."""
        if not isinstance(params, Mapping):
            raise ValueError(f"adapter_params must be a JSON object, got {type(params).__name__}")
        unknown = sorted(set(params) - set(_KNOWN))
        if unknown:
            raise ValueError(f"unknown adapter_params {unknown}; known: {list(_KNOWN)}")
        path = params.get("kvtier_config")
        if not isinstance(path, str) or not path:
            raise ValueError("adapter_params.kvtier_config must be the path of a kvtier YAML file")
        if not os.path.isfile(path):
            raise ValueError(f"adapter_params.kvtier_config: no such file {path!r}")
        try:
            chain = load_config(path)
        except KvtierError as exc:
            raise ValueError(f"adapter_params.kvtier_config: {exc}") from exc
        namespace = params.get("namespace", "lmcache")
        if not isinstance(namespace, (str, Mapping)) or not namespace:
            raise ValueError("adapter_params.namespace must be a model name or a namespace object")
        lock_copies = params.get("lock_copies", "ram")
        if lock_copies not in LOCK_COPIES:
            raise ValueError(f"adapter_params.lock_copies must be one of {list(LOCK_COPIES)}")
        try:
            max_locked = parse_size(params.get("max_locked_bytes", "1GiB"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"adapter_params.max_locked_bytes: {exc}") from exc
        workers = params.get("job_workers", 4)
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError("adapter_params.job_workers must be a positive integer")
        tenants = params.get("tenants")
        if tenants is not None and tenants != "salt" and not (
                isinstance(tenants, Mapping) and all(isinstance(k, str) for k in tenants)
                and all(_is_tenant(t) for t in tenants.values())):
            raise ValueError("adapter_params.tenants must be 'salt' or an object mapping each "
                             "cache_salt to a tenant name (letters, digits, _ . : @ -)")
        shared = params.get("shared_tenants", [])
        if not isinstance(shared, list) or not all(_is_tenant(t) for t in shared):
            raise ValueError("adapter_params.shared_tenants must be a list of tenant names")
        if shared and tenants is None:
            raise ValueError("adapter_params.shared_tenants needs adapter_params.tenants")
        try:
            prefixes = parse_keep_prefixes(params.get("keep_prefixes", []))
        except ValueError as exc:
            raise ValueError(f"adapter_params.keep_prefixes: {exc}") from exc
        chunk_size = params.get("chunk_size", 256)
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError("adapter_params.chunk_size must be a positive integer (the "
                             "server's --chunk-size)")
        algorithm = params.get("hash_algorithm", "blake3")
        if not isinstance(algorithm, str) or not algorithm:
            raise ValueError("adapter_params.hash_algorithm must be the server's "
                             "--hash-algorithm (builtin, sha256_cbor, blake3)")
        return cls(path, chain, namespace, lock_copies, max_locked, workers,
                   tenants, frozenset(shared), prefixes, chunk_size, algorithm)


def _is_tenant(name: Any) -> bool:
    try:
        check_tenant(name)
    except ValueError:
        return False
    return True
