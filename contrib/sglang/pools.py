"""SGLang's v2 calls for hybrid models: the pages of extra host pools beside the KV.

A hybrid model (Mamba, sliding-window attention) keeps per-page state in host
pools of their own, which SGLang registers with ``register_mem_host_pool_v2``
and moves with ``batch_set_v2`` / ``batch_get_v2`` after the KV pages.  Each
pool's page is one block (its flat data page), keyed by
:func:`~kvtier.contrib.sglang.keys.pool_key`.  ``batch_exists_v2`` answers
the usable prefix: a page counts only with every part a pool's hit policy
asks for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName

__all__ = ["PoolPages", "usable_prefix"]


class PoolPages:
    """One registered host pool as SGLang's v2 calls address it."""

    def __init__(self, name: str, pool: Any) -> None:
        self.name, self.pool = name, pool
        self.page_size = int(getattr(pool, "page_size", 1) or 1)

    @functools.cached_property
    def page_bytes(self) -> int:
        """Bytes of one flat page; asked at first use, since SGLang registers every pool
        at attach and some (split-head, MXFP8) have no flat pages: using those faults."""
        return _nbytes(self.pool.get_dummy_flat_data_page())

    def offsets(self, host_indices: Any, pages: int) -> list[int]:
        """The index of each page's first slot in the pool (one per key)."""
        if host_indices is None or host_indices.numel() != pages * self.page_size:
            got = 0 if host_indices is None else host_indices.numel()
            raise ValueError(f"pool {self.name!r}: {pages} pages but {got} host indices "
                             f"({self.page_size} per page)")
        return [int(i) for i in host_indices.reshape(-1)[:: self.page_size].tolist()]

    def read(self, offsets: Sequence[int]) -> list[torch.Tensor]:
        return [self.pool.get_data_page(o, flat=True).contiguous() for o in offsets]

    def scratch(self, pages: int) -> list[torch.Tensor]:
        return [self.pool.get_dummy_flat_data_page() for _ in range(pages)]

    def write(self, offset: int, page: torch.Tensor) -> None:
        self.pool.set_from_flat_data_page(offset, page)


def _nbytes(tensor: torch.Tensor) -> int:
    return int(tensor.numel() * tensor.element_size())


def usable_prefix(
    kv_pages: int, transfers: Sequence[Any], present: Callable[[Any, int], bool]
) -> tuple[int, dict[str, int], list[int]]:
    """The usable prefix of ``kv_pages`` KV pages given each extra pool's parts.

    ``present(transfer, page)`` says whether the transfer's pool holds page
    ``page``.  ``ALL_PAGES`` pools must hold every page of the prefix;
    ``TRAILING_PAGES`` pools only the last ``len(transfer.keys)`` of it.
    Returns the prefix (the longest length every pool allows), each pool's
    own boundary, and every allowed length (SGLang intersects them over
    ranks).  A ``BLOCK_GROUPS`` pool never gates the KV hit and is given no
    verdict (SGLang then asks no load of it).
    """
    hits: dict[str, int] = {PoolName.KV: kv_pages} if kv_pages else {}
    restorable = set(range(1, kv_pages + 1))
    for transfer in transfers:
        if not restorable:
            break
        if transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
            boundary = next((i for i in range(kv_pages) if not present(transfer, i)), kv_pages)
            allowed = set(range(1, boundary + 1))
        elif transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
            trailing = max(1, len(transfer.keys or ()))
            held = [present(transfer, i) for i in range(kv_pages)]
            allowed = {n for n in range(1, kv_pages + 1)
                       if all(held[max(0, n - trailing) : n])}
            boundary = max(allowed, default=0)
        else:
            continue
        if boundary:
            hits[transfer.name] = boundary
        restorable &= allowed
    ordered = sorted(restorable)
    return (ordered[-1] if ordered else 0), hits, ordered
