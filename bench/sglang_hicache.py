"""SGLang HiCache pages through kvtier: SGLang's v0 (copying) and v1 (zero-copy) paths.

    python bench/sglang_hicache.py [--pages 32] [--layers 16] [--page-tokens 64]
        [--fs DIR] [--repeats 5]

An ``MHATokenToKVPoolHost`` (``page_first``, bf16, 8 heads of 128) is filled
with random bytes.  Batches of pages are stored and loaded through the page
methods of SGLang's ``HiCacheController``: ``_generic_page_set/_get`` (v0)
and ``_page_set_zero_copy/_get_zero_copy`` (v1).  The chain is one host tier,
or an fs tier in ``--fs DIR`` (reads then come from the page cache).  The
ceiling is one ``memcpy`` of a batch's bytes, measured in the same run.
Best of ``--repeats``; GB are 10^9 bytes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from sglang_host import import_host_pools, mha_pool

import_host_pools()
from sglang.srt.managers.cache_controller import HiCacheController, PrefetchOperation  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

from kvtier.contrib.sglang import extra_config  # noqa: E402


def attach(chain_yaml: Path, pool: Any, v1: bool) -> Any:
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="bench", extra_config=extra_config(chain_yaml, interface_v1=v1,
                                                      keep_host_tier=True),
    )
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    return backend


def run(args: argparse.Namespace, chain_yaml: Path, v1: bool) -> tuple[float, float, int]:
    tokens = args.pages * args.page_tokens
    pool = mha_pool("page_first", layers=args.layers, heads=8, head_dim=128,
                    page_size=args.page_tokens, device_tokens=tokens)
    pool.kv_buffer.view(-1).view(torch.uint8).random_(0, 256)
    backend = attach(chain_yaml, pool, v1)
    state = SimpleNamespace(storage_backend=backend, storage_host_pool=pool,
                            page_size=args.page_tokens)
    put = HiCacheController._page_set_zero_copy if v1 else HiCacheController._generic_page_set
    get = HiCacheController._page_get_zero_copy if v1 else HiCacheController._generic_page_get
    src, dst = torch.arange(0, tokens), torch.arange(tokens, 2 * tokens)
    write = read = float("inf")
    for rep in range(args.repeats):
        keys = [f"{rep:02x}{int(v1):02x}{page:060x}" for page in range(args.pages)]
        start = time.perf_counter()
        assert put(state, keys, src)
        write = min(write, time.perf_counter() - start)
        start = time.perf_counter()
        assert get(state, PrefetchOperation("bench", []), keys, dst) == args.pages
        read = min(read, time.perf_counter() - start)
        raw = pool.kv_buffer.view(torch.uint8)  # bytes: random bf16 holds NaNs
        assert torch.equal(raw[:, :tokens], raw[:, tokens : 2 * tokens])
    backend.close()
    nbytes = tokens * pool.get_size_per_token()
    return nbytes / write / 1e9, nbytes / read / 1e9, nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=32)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--page-tokens", type=int, default=64)
    parser.add_argument("--fs", default=None, help="directory of an fs tier (default: host)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tier = ({"name": "disk", "backend": "fs", "url": args.fs} if args.fs
                else {"name": "ram", "backend": "host", "capacity": "4GiB"})
        chain_yaml = Path(tmp) / "tiers.yaml"
        chain_yaml.write_text(yaml.safe_dump({"chain": [tier]}))
        results = {v1: run(args, chain_yaml, v1) for v1 in (False, True)}
    nbytes = results[True][2]
    buffer = torch.empty(nbytes, dtype=torch.uint8).random_(0, 256)
    target = torch.empty_like(buffer)
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        target.copy_(buffer)
        best = min(best, time.perf_counter() - start)
    ceiling = nbytes / best / 1e9
    print(f"{args.pages} pages of {nbytes // args.pages / 2**20:.1f} MiB on {tier['name']}; "
          f"memcpy ceiling {ceiling:.2f} GB/s")
    for v1, (write, read, _) in results.items():
        print(f"  {'v1 zero-copy' if v1 else 'v0 copying  '}  write {write:5.2f} GB/s "
              f"({write / ceiling:.2f} x ceiling)  read {read:5.2f} GB/s "
              f"({read / ceiling:.2f} x ceiling)")


if __name__ == "__main__":
    main()
