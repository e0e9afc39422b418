"""Cost of encryption at rest on an fs tier: 2 MiB blocks, plaintext beside encrypted.

    python bench/encryption.py [--root DIR] [--blocks 32] [--rounds 7]

Each round, for each of the two tiers in turn (so both see the same machine):
a put of ``--blocks`` blocks in batches of 16 (written with O_DIRECT), a get
of them with nothing in the page cache (read with O_DIRECT), then a get of
the same blocks once a plain read has put them in the page cache.  Blocks
and buffers are page-aligned, as an engine's KV rows are.  The two
tiers are one fs root each under ``--root`` (default: a temporary directory
on the disk holding /var/tmp), opened for one tenant, with ``encrypt`` unset
and set (a master key in the environment).  Prints the median per block of
each, and the encrypted tier's cost over plaintext.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import kvtier
import kvtier.chain
from kvtier.chain.tenants import open_tenants
from kvtier.tierbench.ceilings import drop_page_cache  # what kvtier bench drops by

BLOCK = 2 << 20
BATCH = 16


def aligned(size: int) -> np.ndarray:
    """``size`` bytes at a page boundary, as an engine's KV rows are (O_DIRECT takes
    them without a bounce copy)."""
    room = np.empty(size + 4096, dtype=np.uint8)
    start = -room.ctypes.data % 4096
    return room[start : start + size]


def files_under(root: Path) -> list[Path]:
    return [Path(d) / n for d, _, names in os.walk(root) for n in names if n.endswith(".kvb")]


def warm_cache(root: Path) -> None:
    for path in files_under(root):
        path.read_bytes()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=None)
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    os.environ["KVTIER_BENCH_MASTER"] = secrets.token_hex(32)
    base = Path(args.root or tempfile.mkdtemp(prefix="kvtier-enc-", dir="/var/tmp"))
    rng = np.random.default_rng(0)
    blocks = [aligned(BLOCK) for _ in range(args.blocks)]
    for block in blocks:
        block[:] = rng.integers(0, 255, BLOCK, dtype=np.uint8)
    outs = [aligned(BLOCK) for _ in range(args.blocks)]
    ns = kvtier.Namespace("enc-bench", dtype="bfloat16", tokens_per_block=16)
    variants = {"plaintext": "none", "encrypted": "env:KVTIER_BENCH_MASTER"}
    times: dict[str, dict[str, list[float]]] = {
        v: {"put": [], "get uncached": [], "get cached": []} for v in variants}
    opened: dict[str, tuple[Any, Path]] = {}
    for name, encrypt in variants.items():
        root = base / name
        cfg = {"chain": [{"name": "disk", "backend": "fs", "url": str(root), "fsync": False,
                          "encrypt": encrypt}]}
        opened[name] = (open_tenants(cfg, ns), root)
    try:
        cpu_tiers = {name: t.chain("acme").tiers[0] for name, (t, _) in opened.items()}
        for r in range(args.rounds):
            # each round the other tier first, so neither always follows the other
            for name, (tenants, root) in sorted(opened.items(), reverse=r % 2 == 1):
                chain = tenants.chain("acme")
                keys = [f"{r}-{i}".encode() for i in range(args.blocks)]
                start = time.perf_counter()
                for lo in range(0, args.blocks, BATCH):
                    assert all(chain.put(keys[lo : lo + BATCH], blocks[lo : lo + BATCH]))
                times[name]["put"].append(time.perf_counter() - start)
                for label in ("get uncached", "get cached"):
                    if label == "get uncached":
                        drop_page_cache(files_under(root))
                    else:
                        warm_cache(root)
                    start = time.perf_counter()
                    for lo in range(0, args.blocks, BATCH):
                        assert all(chain.get(keys[lo : lo + BATCH], outs[lo : lo + BATCH]))
                    times[name][label].append(time.perf_counter() - start)
                assert all(np.array_equal(o, b) for o, b in zip(outs, blocks))
                chain.evict(keys)
        cpu_only(cpu_tiers, blocks[0], 3 * args.rounds)
    finally:
        for tenants, _ in opened.values():
            tenants.close()
        if args.root is None:  # a temporary root of ours: 128 MiB and more of blocks
            shutil.rmtree(base, ignore_errors=True)
    print(f"fs tier, {args.blocks} x 2 MiB blocks in batches of {BATCH}, median of "
          f"{args.rounds} rounds, per block (root {args.root or '/var/tmp'}; load average "
          f"{os.getloadavg()[0]:.1f})")
    for op in ("put", "get uncached", "get cached"):
        plain = statistics.median(times["plaintext"][op]) / args.blocks * 1e3
        sealed = statistics.median(times["encrypted"][op]) / args.blocks * 1e3
        # the median of each round's ratio: both sides of a ratio saw the same moment
        paired = statistics.median(e / p for e, p in zip(times["encrypted"][op],
                                                         times["plaintext"][op]))
        rate = BLOCK / 1e6  # GB/s from ms per block
        print(f"  {op:13s} plaintext {plain:6.3f} ms ({rate / plain:5.2f} GB/s)  encrypted "
              f"{sealed:6.3f} ms ({rate / sealed:5.2f} GB/s)  "
              f"cost {100 * (paired - 1):+5.1f}% (median of the rounds' ratios)")


def cpu_only(tiers: dict[str, kvtier.chain.Tier], block: np.ndarray, rounds: int) -> None:
    """The CPU part alone, in memory: framing a block as each tier does, and reading it back."""
    from kvtier.block import framing

    out = aligned(BLOCK)
    for name, tier in tiers.items():
        enc, dec = [], []
        for _ in range(rounds):
            start = time.perf_counter()
            blob = framing.encode(tier.namespace.fingerprint, b"k", block, tier.codec)
            enc.append(time.perf_counter() - start)
            start = time.perf_counter()
            framing.decode_into(blob, tier.namespace.fingerprint, b"k", out.data, seal=tier.seal)
            dec.append(time.perf_counter() - start)
        print(f"  in memory, {name:9s}: frame {statistics.median(enc) * 1e3:.3f} ms, "
              f"check and copy out {statistics.median(dec) * 1e3:.3f} ms per block")


if __name__ == "__main__":
    main()
