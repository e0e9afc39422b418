"""A kvtier chain as SGLang's HiCache storage backend (its L3 tier).

SGLang's ``StorageBackendFactory`` builds :class:`KvtierStorage` from
``--hicache-storage-backend dynamic`` and the extra config
``{"backend_name": "kvtier", "module_path": "kvtier.contrib.sglang",
"class_name": "KvtierStorage", "kvtier_config": "tiers.yaml"}``, as
``KvtierStorage(storage_config, kwargs)``.  The chain opens when SGLang
registers its host KV pool, the first moment the KV dtype, page size and
layout are known; they are part of the namespace.

Two ways SGLang moves pages, both supported:

v0 (``get``/``set``/``batch_get``/``batch_set``)
    SGLang hands a flat tensor per page: a copy of the page on writes, a
    scratch page it copies into the pool on reads.  One block per page.
v1 (``batch_get_v1``/``batch_set_v1``, ``"interface_v1": 1``)
    SGLang hands host-pool indices.  The pool's ``get_page_buffer_meta``
    names the byte regions of each page (K and V, per layer in the
    ``layer_first`` layout, one region for MLA's ``page_first``); each region
    is one block, read straight into the pool's memory and written straight
    from it: the block encoding is the only copy.

Hybrid models (v2: ``batch_exists_v2``/``batch_get_v2``/``batch_set_v2``)
    SGLang registers each extra host pool (Mamba states, sliding-window KV)
    and moves its pages after the KV pages; each is one block, its flat
    data page (see :mod:`.pools`).  ``batch_exists_v2`` counts a page only
    with every part the pools' hit policies ask for.

A fault below (a tier down, a corrupt block, a full disk) is a miss or
``False`` for SGLang, logged once per call kind; the chain's stats count it.

Tenants.  SGLang's storage calls carry no request (its controllers fill only
``prefix_keys``), so the tenant is a setting of the engine process: the extra
config's ``tenant`` (default ``default``), part of the namespace.  Engines of
different tenants on one pool never read each other's pages; per-request
tenancy is not available under SGLang (docs/tenants.md).

Keep.  The extra config's ``keep_prefixes`` names prefixes (token ids) whose
pages the engine's tenant keeps, within its ``keep`` budget, as they are
stored or loaded (:mod:`.keep`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolTransferResult

import kvtier
from kvtier.block.namespace import DEFAULT_TENANT, check_tenant
from kvtier.config import ChainConfig, load_config
from kvtier.spec import ConfigError, KvtierError, PluginError

from .args import storage_chain
from .keep import PageKeeper, parse_keep_prefixes
from .keys import MAX_REGIONS, PAGE, namespace_for, pool_key, storage_key
from .pools import PoolPages, usable_prefix

__all__ = ["KvtierStorage"]

log = logging.getLogger("kvtier.sglang")


def _byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory (no copy)."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError("SGLang pages must be contiguous CPU tensors")
    return tensor.reshape(-1).view(torch.uint8).numpy().data


class _HostMemory:
    """Byte views of a host pool's buffers, addressed by the pointers SGLang reports.

    ``get_page_buffer_meta`` speaks in raw addresses; each is mapped back to
    an offset in one of the pool's own tensors, so a region outside them is
    refused instead of touched.
    """

    def __init__(self, host_pool: Any) -> None:
        tensors: list[torch.Tensor] = []
        # kv_buffer for the MHA and MLA pools; the split MLA layout keeps the rest apart
        for name in ("kv_buffer", "k_buffer", "v_buffer", "index_k_buffer", "index_k_scale_buffer"):
            value = getattr(host_pool, name, None)
            values = value if isinstance(value, (list, tuple)) else [value]
            tensors.extend(t for t in values if isinstance(t, torch.Tensor))
        self._spans: list[tuple[int, int, memoryview]] = []
        for tensor in tensors:
            if tensor.device.type == "cpu" and tensor.is_contiguous() and tensor.numel():
                start = tensor.data_ptr()
                view = _byte_view(tensor)
                self._spans.append((start, start + view.nbytes, view))
        if not self._spans:
            raise ConfigError(
                f"kvtier: the {type(host_pool).__name__} host pool has no contiguous CPU "
                "buffer; the v1 interface needs one (drop interface_v1 to use v0)"
            )

    def region(self, address: int, size: int) -> memoryview:
        for start, end, view in self._spans:
            if start <= address and address + size <= end:
                offset = address - start
                return view[offset : offset + size]
        raise ValueError(f"host region {address:#x}+{size} lies outside the host pool")


class KvtierStorage(HiCacheStorage):  # type: ignore[misc]
    """SGLang HiCache storage on a kvtier chain (see the module docs)."""

    def __init__(self, storage_config: Any, kwargs: dict[str, Any] | None = None) -> None:
        extra: dict[str, Any] = dict(storage_config.extra_config or {})
        extra.update(kwargs or {})
        self.storage_config = storage_config
        self.chain_config = _chain_config(extra)
        self.tenant = _tenant_of(extra)
        self.interface = "v1" if bool(extra.get("interface_v1", 0)) else "v0"
        try:  # named prefixes to keep (keep.py): checked, and their files read, now
            self.keep_prefixes = parse_keep_prefixes(extra.get("keep_prefixes", []))
        except ValueError as exc:
            raise ConfigError(f"kvtier: extra config 'keep_prefixes': {exc}") from exc
        self._keeper: PageKeeper | None = None
        self.chain: kvtier.Chain | None = None
        self.mem_pool_host: Any = None
        self.faults = 0
        self._regions = 1
        self._host: _HostMemory | None = None
        self._pools: dict[str, PoolPages] = {}  # v2: extra host pools by name
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    # set-up -------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Open the chain in the namespace of this host pool (SGLang calls this once)."""
        namespace = namespace_for(self.storage_config, mem_pool_host, self.interface)
        namespace = namespace.for_tenant(self.tenant)
        host = None
        regions = 1
        if self.interface == "v1":
            host = _HostMemory(mem_pool_host)
            page = torch.arange(mem_pool_host.page_size, dtype=torch.int64)
            regions = len(mem_pool_host.get_page_buffer_meta(page)[0])
            if not 0 < regions <= MAX_REGIONS:
                raise ConfigError(f"kvtier: a host page has {regions} buffer regions")
        self.close()
        self._pools.clear()
        self.mem_pool_host = mem_pool_host
        self._host, self._regions = host, regions
        self.chain = kvtier.open_chain(self.chain_config, namespace)
        if self.keep_prefixes:  # hashed now: the pool names the page size
            self._keeper = PageKeeper(self.keep_prefixes, self.tenant,
                                      namespace.tokens_per_block)
        log.info(
            "kvtier: HiCache storage on %s, namespace %s (%s, %s, %s, tenant %s), interface %s",
            " -> ".join(t.name for t in self.chain.tiers), namespace.hex, namespace.model,
            namespace.kv_layout, namespace.parallel_layout, namespace.tenant, self.interface,
        )

    def close(self) -> None:
        """Finish queued writes and close the chain."""
        chain, self.chain = self.chain, None
        if chain is not None:
            chain.close()

    def clear(self) -> bool:
        """Remove every block of this rank's namespace from the tiers that can list theirs.

        SGLang's clear endpoint assumes the storage is empty afterwards.  Each
        tier whose backend lists its blocks (``kvtier_scan``: fs, object,
        Redis) is listed in this namespace, and what it holds is evicted from
        every tier of the chain, so a copy in a RAM tier goes too.  What stays:
        other namespaces (other ranks, models, dtypes, layouts) sharing the
        store, and blocks only a tier that cannot list held (a ``peer`` tier,
        or a kept ``host`` tier's blocks that no tier below held).  True once
        every listing tier was cleared, False (logged) if one failed; like
        SGLang's file backend, a fault is not raised.
        """
        chain = self.chain
        if chain is None:
            log.warning("kvtier: clear() before a host pool was registered (or after close)")
            return False
        removed, kept, failed = 0, [], set[str]()
        for tier in list(chain.tiers):
            try:
                for batch in tier.scan(chain.namespace.hex):
                    removed += chain.evict([entry[1] for entry in batch])
                    # a tier whose evict faulted is skipped by the chain: its blocks stayed
                    failed.update(t.name for t in chain.tiers if not t.readable)
            except PluginError:  # no kvtier_scan: it cannot say what it holds
                kept.append(tier.name)
            except Exception as exc:
                failed.add(tier.name)
                log.error("kvtier: clear() of tier %r failed: %r", tier.name, exc)
        if failed:
            log.error("kvtier: clear() left blocks in tiers %s", sorted(failed))
        log.info("kvtier: clear() removed %d block(s) of namespace %s%s", removed,
                 chain.namespace.hex, f"; tiers {kept} cannot list theirs, kept" if kept else "")
        return not failed

    def chain_stats(self) -> dict[str, Any]:
        """The chain's per-tier counters plus the faults this adapter turned into misses."""
        stats = self.chain.stats() if self.chain is not None else {"tiers": []}
        return {**stats, "adapter_faults": self.faults}

    # faults --------------------------------------------------------------------
    def _open_chain(self) -> kvtier.Chain:
        if self.chain is None:
            raise kvtier.ClosedError("kvtier: no host pool registered yet (or closed)")
        return self.chain

    def _fault(self, op: str, exc: BaseException) -> None:
        with self._lock:
            self.faults += 1
            first = op not in self._logged
            self._logged.add(op)
        if first:
            log.warning("kvtier: %s failed, answering a miss (logged once): %r", op, exc)
        else:
            log.debug("kvtier: %s failed: %r", op, exc)

    def _keep(self, chain: kvtier.Chain, keys: Sequence[str], done: Sequence[bool],
              load: bool) -> None:
        """Keep the named prefixes' pages among ``keys`` stored (or loaded: ``load``)."""
        if not self._keeper:
            return
        ours = self._keeper.matching([k for k, ok in zip(keys, done) if ok], load)
        if ours:
            try:  # within the tenant's keep budget; a refusal is counted by the tier
                chain.keep(self._page_keys(ours))
            except Exception as exc:
                self._fault("keep", exc)

    def _page_keys(self, keys: Sequence[str]) -> list[bytes]:
        """Every stored key of ``keys``' pages, page after page."""
        if self.interface == "v0":
            return [storage_key(k, PAGE) for k in keys]
        return [storage_key(k, r + 1) for k in keys for r in range(self._regions)]

    # v0: whole pages as tensors --------------------------------------------------
    def get(
        self, key: str, target_location: Any = None, target_sizes: Any = None
    ) -> torch.Tensor | None:
        """Page ``key`` into ``target_location`` (returned), or None on a miss."""
        return self.batch_get([key], [target_location])[0]

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[torch.Tensor | None]:
        """Pages into ``target_locations`` (flat tensors of a page each); None where missed."""
        targets = list(target_locations) if target_locations is not None else [None] * len(keys)
        try:
            chain = self._open_chain()
            stored = [storage_key(k, PAGE) for k in keys]
            given = [t for t in targets if t is not None]
            if len(given) < len(targets):
                pages = [self._get_new(chain, key, t) for key, t in zip(stored, targets)]
            else:
                found = chain.get(stored, [_byte_view(t) for t in given])
                pages = [t if hit else None for t, hit in zip(given, found)]
            self._keep(chain, keys, [p is not None for p in pages], load=True)
            return pages
        except Exception as exc:
            self._fault("batch_get", exc)
            return [None] * len(keys)

    def _get_new(self, chain: kvtier.Chain, key: bytes, target: Any) -> torch.Tensor | None:
        if target is not None:
            return target if chain.get([key], [_byte_view(target)])[0] else None
        data = chain.get_bytes([key])[0]
        if data is None:
            return None
        dtype = getattr(self.mem_pool_host, "dtype", torch.uint8)
        return torch.frombuffer(bytearray(data), dtype=dtype)

    def set(
        self,
        key: str,
        value: Any = None,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Store page tensor ``value`` under ``key``; False if no tier took it."""
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Store page tensors; True only if every page was stored."""
        if values is None or len(values) != len(keys):
            return False
        try:
            chain = self._open_chain()
            views = [_byte_view(v.contiguous()) for v in values]
            stored = chain.put([storage_key(k, PAGE) for k in keys], views)
            self._keep(chain, keys, stored, load=False)
            return all(stored)
        except Exception as exc:
            self._fault("batch_set", exc)
            return False

    def exists(self, key: str) -> bool:
        """Whether every block of page ``key`` is held by some tier."""
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading pages of ``keys`` are stored in full and worth loading
        (the reusable prefix; the chain's ``load_policy`` weighs the load against
        recomputing the pages' tokens)."""
        if not keys:
            return 0
        try:
            chain = self._open_chain()
            where = chain.lookup(self._page_keys(keys))
            per_page = len(where) // len(keys)
            held = len(keys)
            for page in range(len(keys)):
                if None in where[page * per_page : (page + 1) * per_page]:
                    held = page
                    break
            # a page's blocks (one per host-pool region) share its tokens
            tokens = max(1, chain.namespace.tokens_per_block // per_page)
            return chain.worth_loading(where[: held * per_page], tokens) // per_page
        except Exception as exc:
            self._fault("batch_exists", exc)
            return 0

    # v1: straight into and out of the host pool ------------------------------------
    def _regions_of(self, keys: Sequence[str], host_indices: torch.Tensor) -> list[memoryview]:
        host, pool = self._host, self.mem_pool_host
        if host is None or pool is None:
            raise kvtier.ClosedError("kvtier: the v1 interface needs interface_v1 and a host pool")
        pointers, sizes = pool.get_page_buffer_meta(host_indices)
        if len(pointers) != len(keys) * self._regions:
            raise ValueError(
                f"{len(keys)} keys but {len(pointers)} host regions ({self._regions} per page)"
            )
        return [host.region(int(p), int(n)) for p, n in zip(pointers, sizes)]

    def _per_page(self, flags: Sequence[bool], pages: int) -> list[bool]:
        n = self._regions
        return [all(flags[i * n : (i + 1) * n]) for i in range(pages)]

    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> list[bool]:
        """Read pages straight into the host pool at ``host_indices``; per page, hit or not."""
        if not keys:
            return []
        try:
            regions = self._regions_of(keys, host_indices)
            chain = self._open_chain()
            found = self._per_page(chain.get(self._page_keys(keys), regions), len(keys))
        except Exception as exc:
            self._fault("batch_get_v1", exc)
            return [False] * len(keys)
        self._keep(chain, keys, found, load=True)
        return found

    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> list[bool]:
        """Write pages straight from the host pool at ``host_indices``; per page, stored or not."""
        if not keys:
            return []
        try:
            regions = self._regions_of(keys, host_indices)
            chain = self._open_chain()
            stored = self._per_page(chain.put(self._page_keys(keys), regions), len(keys))
        except Exception as exc:
            self._fault("batch_set_v1", exc)
            return [False] * len(keys)
        self._keep(chain, keys, stored, load=False)
        return stored

    # v2: hybrid models' extra host pools (Mamba, sliding window, ...) ------------------
    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Remember an extra host pool; its pages are stored under keys of their own."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._pools[host_pool_name] = PoolPages(host_pool_name, host_pool)

    def _pool(self, name: Any) -> PoolPages:
        pool = self._pools.get(name)
        if pool is None:
            raise KeyError(f"kvtier: no host pool {name!r} was registered")
        return pool

    def _pool_keys(self, pool: PoolPages, keys: Sequence[str]) -> list[bytes]:
        return [pool_key(k, str(pool.name), pool.page_bytes) for k in keys]

    def batch_exists_v2(
        self, keys: list[str], pool_transfers: Any = None, extra_info: Any = None
    ) -> Any:
        """The usable prefix of ``keys``: KV pages stored in full, and each extra pool's
        parts as its hit policy asks (see :func:`~kvtier.contrib.sglang.pools.usable_prefix`)."""
        transfers = list(pool_transfers or ())
        if not keys:
            return PoolTransferResult.empty()
        try:
            chain = self._open_chain()
            kv_pages = self.batch_exists(keys)
            held: dict[int, list[bool]] = {}
            for i, t in enumerate(transfers):
                pool = self._pool(t.name)
                where = chain.lookup(self._pool_keys(pool, keys[:kv_pages]))
                held[i] = [w is not None for w in where]
            index = {id(t): i for i, t in enumerate(transfers)}
            final, hits, restorable = usable_prefix(
                kv_pages, transfers, lambda t, page: held[index[id(t)]][page])
        except Exception as exc:
            self._fault("batch_exists_v2", exc)
            return PoolTransferResult.empty()
        return PoolTransferResult(final, hits, restorable)

    def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> dict[Any, list[bool]]:
        """Store each extra pool's pages (a flat page per block); per pool, per page, stored."""
        results: dict[Any, list[bool]] = {}
        for t in transfers:
            keys = list(t.keys or ())
            try:
                pool = self._pool(t.name)
                pages = pool.read(pool.offsets(t.host_indices, len(keys)))
                stored = self._open_chain().put(
                    self._pool_keys(pool, keys), [_byte_view(p) for p in pages])
            except Exception as exc:
                self._fault("batch_set_v2", exc)
                stored = [False] * len(keys)
            results[t.name] = [bool(f) for f in stored]
        return results

    def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> dict[Any, list[bool]]:
        """Load each extra pool's pages into the pool; per pool, per page, found."""
        results: dict[Any, list[bool]] = {}
        for t in transfers:
            keys = list(t.keys or ())
            try:
                pool = self._pool(t.name)
                offsets = pool.offsets(t.host_indices, len(keys))
                pages = pool.scratch(len(keys))
                found = self._open_chain().get(
                    self._pool_keys(pool, keys), [_byte_view(p) for p in pages])
                for offset, page, hit in zip(offsets, pages, found):
                    if hit:  # only whole, checked pages reach the pool
                        pool.write(offset, page)
            except Exception as exc:
                self._fault("batch_get_v2", exc)
                found = [False] * len(keys)
            results[t.name] = [bool(f) for f in found]
        return results


def _tenant_of(extra: dict[str, Any]) -> str:
    """The engine's tenant, from the extra config's ``tenant``; a bad name stops SGLang."""
    tenant = extra.get("tenant", DEFAULT_TENANT)
    try:
        return check_tenant(tenant)
    except ValueError as exc:
        raise ConfigError(f"kvtier: extra config 'tenant': {exc}") from exc


def _chain_config(extra: dict[str, Any]) -> ChainConfig:
    """The chain named by ``kvtier_config`` in SGLang's extra config, fully validated.

    A leading host tier is left out unless ``keep_host_tier`` is set: SGLang's
    own host pool is that RAM tier (see :func:`~kvtier.contrib.sglang.args.storage_chain`).
    """
    path = extra.get("kvtier_config")
    if not path:
        raise ConfigError(
            "kvtier: --hicache-storage-backend-extra-config needs 'kvtier_config' "
            "(the path of the chain's YAML); `kvtier sglang-args tiers.yaml` prints the flags"
        )
    try:
        chain = load_config(Path(str(path)).expanduser())
    except KvtierError:
        raise
    except OSError as exc:
        raise ConfigError(f"kvtier: cannot read kvtier_config {path!r}: {exc}") from exc
    return storage_chain(chain, keep_host_tier=bool(extra.get("keep_host_tier", False)))
