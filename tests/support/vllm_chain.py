"""Chain files, damaged blocks and vLLM's offloading spec for the vLLM tests
(``tests/contrib/test_vllm_*.py``).

The host tier here is what vLLM's own CPU tier is sized from; the blocks
:func:`damage_blocks` spoils are the ones the tier must reject and replace.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from kvtier.chain.catalog import CATALOG_HEX

REPO = Path(__file__).parents[2]
HOST_BYTES = 16 << 20


def write_yaml(path: Path, chain: list[dict[str, Any]], **top: Any) -> Path:
    path.write_text(yaml.safe_dump({"chain": chain, **top}, sort_keys=False))
    return path


def host_tier() -> dict[str, Any]:
    return {"name": "ram", "backend": "host", "capacity": HOST_BYTES, "eviction": "arc"}


def damage_blocks(root: Path) -> int:
    """Flip one payload byte in every stored KV block file; how many were changed.

    The namespace descriptors of :mod:`kvtier.chain.catalog` are left alone: not KV.
    """
    count = 0
    for path in root.rglob("*.kvb"):
        if CATALOG_HEX in path.parts:
            continue
        data = bytearray(path.read_bytes())
        data[len(data) - 100] ^= 0xFF
        path.write_bytes(bytes(data))
        count += 1
    return count


class SpecStub:
    """What a secondary tier reads from vLLM's offloading spec: rows of ``row`` bytes,
    the attention ``layers`` of one group, and whether vLLM's KV events are on.

    ``tp`` workers each hold a ``row / tp`` page of a chunk (one copy of the whole
    row when ``replicated``); ``agnostic`` is vLLM's ``is_parallelism_agnostic``."""

    def __init__(self, row: int, layers: Sequence[str] = ("layers.0.attn",),
                 events: bool = False, *, tp: int = 1, agnostic: bool = True,
                 replicated: bool = False) -> None:
        from vllm.v1.kv_offload.config import (
            OffloadingCacheConfig,
            OffloadingConfig,
            OffloadingGroupConfig,
            OffloadingModelConfig,
            OffloadingParallelConfig,
        )

        self.config = OffloadingConfig(
            groups=(OffloadingGroupConfig(32, tuple(layers), 0),),
            worker_kv_bytes_per_block=row, enable_kv_cache_events=events, extra_config={},
            engine_id="test", model=OffloadingModelConfig(name="tiny", dtype="float32"),
            cache=OffloadingCacheConfig(tokens_per_hash=32, blocks_per_chunk=1),
            parallel=OffloadingParallelConfig(
                rank=0, world_size=tp, tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1,
                data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                is_parallelism_agnostic=agnostic,
            ),
            replicated_layout=replicated,
        )
        self.kv_events_config = SimpleNamespace(enable_kv_cache_events=events)
        self.cpu_page_size_per_worker = row if replicated else row // tp
        self.replicated_layout = replicated
