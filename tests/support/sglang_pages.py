"""SGLang pages for the HiCache storage tests (``tests/contrib/test_sglang_*.py``).

How SGLang's cache controller attaches the backend (factory, then host-pool
registration), its storage config for one rank, its chained page hashes,
and the page paths of its ``HiCacheController`` (v1 zero-copy) around a
backend; plus the bytes of host-pool pages, to compare byte for byte.
Importing this module imports SGLang's host pools first (see
:mod:`sglang_host`).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml
from sglang_host import import_host_pools

from kvtier.contrib.sglang import extra_config

import_host_pools()  # before SGLang's other modules: see sglang_host.py
from sglang.srt.managers.cache_controller import HiCacheController, PrefetchOperation  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_hash_str  # noqa: E402

from kvtier.contrib.sglang.storage import KvtierStorage  # noqa: E402

__all__ = [
    "PAGE", "attach", "controller", "fill_random", "host_fs", "indices", "load_v1", "page_bytes",
    "page_hashes", "save_v1", "storage_config", "stored_blocks", "tier_stats", "write_chain",
]

PAGE = 4  # tokens per page in every pool here


def write_chain(path: Path, tiers: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"chain": tiers}))
    return path


def host_fs(tmp_path: Path) -> Path:
    return write_chain(tmp_path / "tiers.yaml", [
        {"name": "ram", "backend": "host", "capacity": "64MiB"},
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "fs")},
    ])


def storage_config(extra: dict[str, Any], *, mla: bool = False, **fields: Any) -> Any:
    """SGLang's HiCacheStorageConfig as its cache controller fills it for one rank."""
    values: dict[str, Any] = {
        "tp_rank": 0, "tp_size": 1, "pp_rank": 0, "pp_size": 1, "attn_cp_rank": 0,
        "attn_cp_size": 1, "is_mla_model": mla, "enable_storage_metrics": False,
        "is_page_first_layout": False, "model_name": "org/tiny-model", "extra_config": extra,
    }
    values.update(fields)
    return HiCacheStorageConfig(**values)


def attach(chain_yaml: Path, pool: Any, *, v1: bool = True, **fields: Any) -> KvtierStorage:
    """What HiCacheController.attach_storage_backend does: factory, then pool registration.

    The chain's host tier is kept (by default SGLang's host pool replaces it)
    so that the RAM tier is part of every test.
    """
    extra = extra_config(chain_yaml, interface_v1=v1, keep_host_tier=True)
    mla = type(pool).__name__.startswith("MLA")
    config = storage_config(extra, mla=mla, is_page_first_layout=pool.layout == "page_first",
                            **fields)
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    assert isinstance(backend, KvtierStorage)
    return backend


def controller(backend: KvtierStorage, pool: Any) -> Any:
    """The state HiCacheController's page get/set methods read, around our backend."""
    return SimpleNamespace(storage_backend=backend, storage_host_pool=pool, page_size=PAGE)


def page_hashes(n: int, seed: int = 0) -> list[str]:
    """SGLang's chained page hashes for n pages of made-up tokens."""
    hashes: list[str] = []
    prior = None
    for page in range(n):
        tokens = [seed * 100_000 + page * PAGE + t for t in range(PAGE)]
        prior = get_hash_str(tokens, prior)
        hashes.append(prior)
    return hashes


def indices(first_page: int, n: int) -> torch.Tensor:
    return torch.arange(first_page * PAGE, (first_page + n) * PAGE, dtype=torch.int64)


def fill_random(pool: Any, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    raw = pool.kv_buffer.view(-1).view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))


def page_bytes(pool: Any, first_page: int, n: int) -> list[bytes]:
    return [
        bytes(pool.get_data_page((first_page + i) * PAGE).contiguous().view(torch.uint8).numpy())
        for i in range(n)
    ]


def save_v1(backend: KvtierStorage, pool: Any, keys: list[str], first_page: int) -> bool:
    return bool(HiCacheController._page_set_zero_copy(
        controller(backend, pool), keys, indices(first_page, len(keys))))


def load_v1(backend: KvtierStorage, pool: Any, keys: list[str], first_page: int) -> int:
    op = PrefetchOperation("req", list(range(len(keys) * PAGE)))
    return int(HiCacheController._page_get_zero_copy(
        controller(backend, pool), op, keys, indices(first_page, len(keys))))


def tier_stats(backend: KvtierStorage, name: str) -> dict[str, Any]:
    return next(t for t in backend.chain_stats()["tiers"] if t["name"] == name)


def stored_blocks(root: Path, namespace: str) -> list[Path]:
    return sorted((root / namespace).rglob("*.kvb"))
