"""Chain files and damaged blocks for the vLLM tests (``tests/contrib/test_vllm_*.py``).

The host tier here is what vLLM's own CPU tier is sized from; the blocks
:func:`damage_blocks` spoils are the ones the tier must reject and replace.
"""

from __future__ import annotations

from pathlib import Path
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
