"""Where vLLM's chunks live in a chain: the kvtier key of an ``OffloadKey``, and the namespace.

Keys.  vLLM's ``OffloadKey`` (block hash + 4-byte KV-group index, 36 bytes
with the default SHA-256 prefix hashing) is used as the kvtier key as is.  A
kvtier key is at most 64 bytes (it names files and objects and sits in every
block header); a longer vLLM key is replaced by its 32-byte BLAKE2b digest,
which keeps keys distinct and still checked against the stored header.

Namespace.  Every block is stored under a :class:`kvtier.Namespace` made from
every part of vLLM's offloading config that decides what a chunk's bytes
mean: model, KV dtype, tokens per chunk, the row layout (KV cache layout, row
bytes, blocks per chunk, tokens per hash, groups and their layers,
canonical/replicated flags, vLLM release) and the parallel layout
(tp/pp/pcp/dcp, world size, rank).  Engines that differ in any of them never
exchange blocks, with one exception that vLLM's own fs tier makes too: where
vLLM declares a chunk's bytes independent of the parallel layout (its
``is_parallelism_agnostic``, or a ``replicated_layout``), the parallel layout
is that of one worker, so a TP=2 writer and a TP=4 reader share blocks.  The
row bytes stay in the namespace, so rows of another size never mix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kvtier.block.namespace import Namespace
from kvtier.spec import MAX_KEY_SIZE

from ._compat import VLLM_VERSION, offloading_fields

__all__ = ["chain_key", "namespace_for"]


def chain_key(key: bytes) -> bytes:
    """The kvtier key for a vLLM ``OffloadKey``: itself, or its digest if over 64 bytes."""
    if 0 < len(key) <= MAX_KEY_SIZE:
        return bytes(key)
    return hashlib.blake2b(bytes(key), digest_size=32, person=b"kvtier-vllm-key").digest()


def namespace_for(
    offloading_config: Any,
    row_bytes: int,
    extra: Mapping[str, Any] | None = None,
    model: str | None = None,
) -> Namespace:
    """The :class:`~kvtier.Namespace` of vLLM chunk rows of ``row_bytes`` bytes.

    ``model`` replaces vLLM's model name (a hub id or a local path), for
    engines that load the same weights from different paths.
    """
    f = offloading_fields(offloading_config)
    groups = f["groups"]
    tokens_per_chunk = groups[0]["tokens_per_block"] * f["blocks_per_chunk"] if groups else 0
    layers = hashlib.blake2b(
        json.dumps([g["layer_names"] for g in groups]).encode(), digest_size=8
    ).hexdigest()
    layout = [
        "vllm-offload-row",
        f"layout={f['kv_cache_layout']}",
        f"row_bytes={row_bytes}",
        f"blocks_per_chunk={f['blocks_per_chunk']}",
        f"tokens_per_hash={f['tokens_per_hash']}",
        "groups=" + ",".join(f"{g['tokens_per_block']}x{g['layers']}" for g in groups),
    ]
    if f["canonical_layout"]:
        layout.append("canonical")
    if f["replicated_layout"]:
        layout.append("replicated")
    release = ".".join(VLLM_VERSION.split(".")[:2])
    fields: dict[str, str] = {"engine": f"vllm-{release}", "layers": layers}
    fields.update({str(k): str(v) for k, v in (extra or {}).items()})
    if f["parallel_agnostic"] or f["replicated_layout"]:
        # the same bytes under any topology: named as one worker's, as vLLM's
        # FileMapper collapses them (a single-worker engine keeps its namespace)
        f.update(tp=1, pp=1, pcp=1, dcp=1, world_size=1, rank=0)
    return Namespace(
        model=model or f["model"],
        dtype=f["dtype"],
        tokens_per_block=tokens_per_chunk,
        kv_layout=";".join(layout),
        parallel_layout=(
            f"tp{f['tp']}-pp{f['pp']}-pcp{f['pcp']}-dcp{f['dcp']}"
            f"-world{f['world_size']}-rank{f['rank']}"
        ),
        extra=fields,
    )
