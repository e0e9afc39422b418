"""SGLang page keys and storage configs, named the way a kvtier chain names blocks.

Nothing here imports SGLang: the functions read the attributes of SGLang's
``HiCacheStorageConfig`` and host pool objects by name, so they can be
checked without the engine.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from kvtier import Namespace
from kvtier.spec import MAX_KEY_SIZE

__all__ = ["MAX_REGIONS", "PAGE", "namespace_for", "parallel_layout", "pool_key", "storage_key"]

#: ``region`` of a whole page, as the v0 calls (``get``/``set``) move it.
PAGE = 0
#: A v1 page is stored as one block per host-pool buffer region; at most this many.
MAX_REGIONS = 0xFFFF

# Key forms, the first byte of every stored key.  A fixed three-byte header
# (form, region) keeps keys of different forms and regions apart without any
# escaping: the rest of the key is never parsed.
_HEX, _TEXT, _DIGEST, _POOL = 1, 2, 3, 4
_HEADER = 3
_HEX_RE = re.compile(r"(?:[0-9a-f]{2})+")


def storage_key(key: str, region: int = PAGE) -> bytes:
    """The kvtier key of SGLang page ``key`` (region ``0``: the whole page; ``i + 1``: buffer i).

    SGLang's page hashes are lowercase hex (64 digits, SHA-256): they are
    stored as their 32 raw bytes.  Other strings are stored as UTF-8 while
    they fit in :data:`~kvtier.spec.MAX_KEY_SIZE` with the header, and as a
    32-byte BLAKE2b digest when longer.
    """
    if not 0 <= region <= MAX_REGIONS:
        raise ValueError(f"region must be 0 to {MAX_REGIONS}, got {region}")
    tail = region.to_bytes(2, "big")
    if len(key) <= 2 * (MAX_KEY_SIZE - _HEADER) and _HEX_RE.fullmatch(key):
        return bytes([_HEX]) + tail + bytes.fromhex(key)
    raw = key.encode("utf-8", "surrogatepass")
    if 0 < len(raw) <= MAX_KEY_SIZE - _HEADER:
        return bytes([_TEXT]) + tail + raw
    return bytes([_DIGEST]) + tail + hashlib.blake2b(raw, digest_size=32).digest()


def pool_key(key: str, pool: str, page_bytes: int) -> bytes:
    """The kvtier key of page ``key``'s part in SGLang's extra host pool ``pool``.

    Hybrid models keep per-page state beside the KV (Mamba, sliding-window
    pools; SGLang's v2 calls).  The key is a digest of the pool's name, the
    bytes of one of its pages and the page key, under a form of its own: it
    never equals a KV page's key, and a pool of another shape never answers.
    """
    raw = f"{pool}\0{page_bytes}\0{key}".encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(raw, digest_size=32, person=b"kvtier-sglang-p").digest()
    return bytes([_POOL, 0, 0]) + digest


def parallel_layout(storage_config: Any) -> str:
    """The share of the KV cache one SGLang rank holds, e.g. ``"tp2-rank1"``.

    MLA caches are replicated over tensor-parallel ranks (SGLang writes them
    from one rank), so their layout leaves the TP rank out and every rank
    reads the same blocks.  Pipeline stages, attention context-parallel and
    decode context-parallel shards each hold different KV and are named.
    """
    cfg = storage_config
    parts = []
    if not cfg.is_mla_model:
        parts.append(f"tp{cfg.tp_size}-rank{cfg.tp_rank}")
        if getattr(cfg, "should_split_heads", False):
            parts.append(f"lcm{cfg.tp_lcm_size}")
    if cfg.pp_size > 1:
        parts.append(f"pp{cfg.pp_size}-rank{cfg.pp_rank}")
    if cfg.attn_cp_size > 1:
        parts.append(f"cp{cfg.attn_cp_size}-rank{cfg.attn_cp_rank}")
    dcp_size = getattr(cfg, "dcp_size", 1)
    if dcp_size > 1:
        parts.append(f"dcp{dcp_size}-rank{cfg.dcp_rank}-tp{cfg.tp_size}")
    return "-".join(parts) or "replicated"


_GEOMETRY = ("layer_num", "head_num", "head_dim", "v_head_dim", "kv_cache_dim")


def namespace_for(storage_config: Any, host_pool: Any, interface: str) -> Namespace:
    """The namespace of the blocks one rank stores, from SGLang's config and host pool.

    It holds the model, KV dtype, tokens per page, the pool's class and
    layout, the interface (``v0`` whole pages, ``v1`` buffer regions), the
    rank's share, and the pool geometry: two SGLang processes share blocks
    only when all of them agree.
    """
    cfg = storage_config
    page_size = getattr(cfg, "logical_page_size", None) or host_pool.page_size
    extra = {
        name: str(getattr(host_pool, name))
        for name in _GEOMETRY
        if isinstance(getattr(host_pool, name, None), int)
    }
    tag = getattr(host_pool, "storage_format_tag", None)
    if tag:
        extra["format"] = str(tag)
    return Namespace(
        model=cfg.model_name or "unnamed-model",
        dtype=str(host_pool.dtype).removeprefix("torch."),
        tokens_per_block=int(page_size),
        kv_layout=f"sglang:{type(host_pool).__name__}:{host_pool.layout}:{interface}",
        parallel_layout=parallel_layout(cfg),
        extra=extra,
    )
