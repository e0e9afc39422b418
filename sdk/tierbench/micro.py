"""The smaller sections of ``kvtier bench``: dispatch, lookup, codec.

``dispatch``
    What pluggy costs per batched hook call: the same ``host`` backend
    instance called through its :class:`~kvtier.plugins.registry.BackendHandle`
    (pluggy's hook caller) and by calling its ``kvtier_*`` method directly,
    on a lookup of a batch (almost no work: the difference is dispatch) and
    on a ``get_into`` of a batch of blocks, against the time of one block's
    ``get_into``.
``lookup``
    ``Chain.lookup`` of N keys on a chain of three ``host`` tiers with every
    key held by the last one: the worst case for a hit, each key asked of
    all three tiers.
``codec``
    No codec (the checksum alone), then zstd at several levels, without and
    with byte shuffle, on synthetic KV
    of both 16-bit float types (Gaussian values with a per-channel scale, as
    attention keys have): stored/raw ratio and encode/decode speed through
    :mod:`kvtier.block.framing`, the code path tiers use.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kvtier.block import framing
from kvtier.block.framing import Codec
from kvtier.block.namespace import Namespace
from kvtier.chain.chain import Chain
from kvtier.config.chain_config import load_config
from kvtier.plugins.registry import default_registry
from kvtier.tierbench.runner import Progress, percentile

__all__ = ["codec_kv", "run_codec", "run_dispatch", "run_lookup"]


def _best_of(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    """Seconds per call: the best of ``repeats`` runs of ``calls`` calls (least disturbed)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def run_dispatch(block_size: int, blocks: int, quick: bool, progress: Progress) -> dict[str, Any]:
    handle = default_registry().create("host")
    handle.open({"capacity": 4 * blocks * block_size + (1 << 20)}, "0" * 32)
    backend: Any = handle.instance
    try:
        keys = [os.urandom(16) for _ in range(blocks)]
        data = [os.urandom(block_size) for _ in range(blocks)]
        handle.put(keys, data, [])
        outs = [[memoryview(bytearray(block_size))] for _ in range(blocks)]
        one = [outs[0]]
        calls, repeats = (200, 3) if quick else (2000, 7)
        # interleaved, so a disturbance of the machine hits both sides alike
        hook_lookup = direct_lookup = float("inf")
        hook_get = direct_get = float("inf")
        for _ in range(repeats):
            hook_lookup = min(hook_lookup, _best_of(lambda: handle.lookup(keys), calls, 1))
            direct_lookup = min(direct_lookup,
                                _best_of(lambda: backend.kvtier_lookup(keys=keys), calls, 1))
            hook_get = min(hook_get, _best_of(lambda: handle.get_into(keys, outs), 3, 1))
            direct_get = min(direct_get, _best_of(
                lambda: backend.kvtier_get_into(keys=keys, buffers=outs), 3, 1))
        progress.step("dispatch")
        single = _best_of(lambda: backend.kvtier_get_into(keys=keys[:1], buffers=one), 20,
                          3 if quick else 7)
        progress.step("dispatch")
    finally:
        handle.close()
    overhead = max(0.0, hook_lookup - direct_lookup)
    return {
        "batch": blocks,
        "block_size": block_size,
        "lookup_hook_us": hook_lookup * 1e6,
        "lookup_direct_us": direct_lookup * 1e6,
        "overhead_per_call_us": overhead * 1e6,
        "get_into_hook_ms": hook_get * 1e3,
        "get_into_direct_ms": direct_get * 1e3,
        "one_block_get_into_us": single * 1e6,
        "overhead_vs_one_block_pct": 100 * overhead / single if single else None,
        "overhead_vs_batch_pct": 100 * overhead / direct_get if direct_get else None,
    }


def run_lookup(sizes: list[int], quick: bool, progress: Progress) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        config = load_config({"chain": [
            {"name": f"t{i}", "backend": "host", "capacity": "64GiB"} for i in range(3)]})
        with Chain(config, Namespace("kvtier-bench-lookup"), job_workers=1) as chain:
            keys = [os.urandom(16) for _ in range(n)]
            last = chain.tiers[2]
            step = 65536
            for start in range(0, n, step):  # framed blocks of one byte, straight into t2
                part = keys[start:start + step]
                last.put_payloads(part, [b"x"] * len(part))
            repeats = 2 if n >= 500_000 else (3 if quick else 30)
            times = []
            for _ in range(repeats):
                start_t = time.perf_counter()
                where = chain.lookup(keys)
                times.append(time.perf_counter() - start_t)
            if where.count(2) != n:
                raise RuntimeError(f"lookup found {where.count(2)} of {n} keys in the last tier")
        rows.append({"keys": n, "tiers": 3, "p50_ms": percentile(times, 50) * 1e3,
                     "min_ms": min(times) * 1e3, "us_per_key": min(times) / n * 1e6,
                     "repeats": repeats})
        progress.step(f"lookup {n} keys")
    return rows


def codec_kv(dtype: str, nbytes: int, seed: int = 0) -> bytes:
    """Synthetic KV of a 16-bit float ``dtype``: N(0, 1) times a per-channel scale."""
    head_dim = 128
    rng = np.random.default_rng(seed)
    count = nbytes // 2
    scale = rng.lognormal(0.0, 1.0, head_dim).astype(np.float32)
    values = rng.standard_normal(count, dtype=np.float32).reshape(-1, head_dim) * scale
    if dtype == "float16":
        return values.astype(np.float16).tobytes()
    # bfloat16: the upper half of float32, rounded to nearest even
    bits = values.reshape(-1).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).tobytes()


def run_codec(block_size: int, levels: list[int], quick: bool, progress: Progress,
              samples: dict[str, bytes] | None = None,
              shuffles: tuple[int, ...] = (0, 2)) -> list[dict[str, Any]]:
    """Ratio and speed per (data, level, shuffle); ``samples`` adds data of one's own."""
    data = {f"synthetic {dt}": codec_kv(dt, block_size) for dt in ("bfloat16", "float16")}
    data.update(samples or {})
    ns, key = Namespace("kvtier-bench-codec").fingerprint, b"codec-key"
    rows = []
    repeats = 3 if quick else 5
    for label, payload in data.items():
        out = memoryview(bytearray(len(payload)))
        # codec none first: its encode is the checksum alone, its decode checksum + copy
        for level, shuffle in [(0, 0)] + [(lv, sh) for lv in levels for sh in shuffles]:
            codec = Codec("zstd", level, shuffle) if level else Codec("none")
            enc = float("inf")
            parts: tuple[bytes, Any] = (b"", b"")
            for _ in range(repeats):  # a put's framing (a Frame does the same work, later)
                start = time.perf_counter()
                parts = framing.encode_parts(ns, key, payload, codec)
                enc = min(enc, time.perf_counter() - start)
            blob = b"".join(parts)
            dec = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                framing.decode_into(blob, ns, key, out, verify=True)
                dec = min(dec, time.perf_counter() - start)
            if out != payload:
                raise RuntimeError(f"codec round trip changed the data ({label})")
            rows.append({"data": label, "codec": codec.name, "level": level, "shuffle": shuffle,
                         "raw_bytes": len(payload), "stored_bytes": len(blob),
                         "ratio": len(payload) / len(blob),
                         "encode_gbps": len(payload) / enc / 1e9,
                         "decode_gbps": len(payload) / dec / 1e9})
            progress.step(f"codec {label} {codec.name} l{level} s{shuffle}")
    return rows
