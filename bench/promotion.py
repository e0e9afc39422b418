"""What promoting a block from an fs tier into a host tier costs, and the work it does.

    python bench/promotion.py [--blocks 16] [--block-size 2MiB] [--rounds 8] [--json]

A chain of ``host`` over ``fs`` (a temporary directory, codec ``none``) gets
``--blocks`` blocks written to the fs tier alone.  Each round opens the chain
afresh, then times ``get`` of the batch into the caller's buffers and the
``flush`` that waits for the promotions it started (``get+promote``); the
same chain with ``promote: false`` on the host tier gives the read alone
(``get``).  Both are read with ``get`` (fs reads straight into the
buffers) and with ``get_bytes`` (whole frames, payloads as new bytes).
Wall time, and the CPU time of every thread of the process, which other
jobs on a shared machine move less; medians over the rounds.

Per block read it also counts, in a separate untimed pass:

* hash passes: xxh3-64 passes over a payload (``xxhash`` digests, and the
  copy that checksums in one pass), by wrapping ``kvtier.block.framing``'s;
* encodes and header parses (``framing.encode_parts``, which ``encode`` calls,
  and ``framing.parse_header``);
* payload-sized allocations: ``malloc``/``calloc``/``realloc``/``memalign``
  calls of at least the payload's size, counted by a tiny ``LD_PRELOAD``
  library compiled here (needs ``cc``; skipped without one).  Every copy of
  a payload into memory of its own is one.

The code measured is whatever ``import kvtier`` finds, so a run with
``PYTHONPATH`` pointing at another checkout measures that one.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import kvtier
from kvtier import Namespace, open_chain
from kvtier.block import framing
from kvtier.config.units import parse_size

NAMESPACE = Namespace("promotion-bench", dtype="bfloat16", tokens_per_block=16)

_SHIM = r"""
#include <stddef.h>
#include <stdlib.h>
extern void *__libc_malloc(size_t), *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t), *__libc_memalign(size_t, size_t);
static long big, least = -1;
static void seen(size_t n) {
    if (least < 0) { const char *s = getenv("KVTIER_BIG_ALLOC"); least = s ? atol(s) : 1L << 60; }
    if ((long)n >= least) __atomic_fetch_add(&big, 1, __ATOMIC_RELAXED);
}
long kvtier_big_allocs(void) { return __atomic_load_n(&big, __ATOMIC_RELAXED); }
void *malloc(size_t n) { seen(n); return __libc_malloc(n); }
void *calloc(size_t m, size_t n) { seen(m * n); return __libc_calloc(m, n); }
void *realloc(void *p, size_t n) { seen(n); return __libc_realloc(p, n); }
void *memalign(size_t a, size_t n) { seen(n); return __libc_memalign(a, n); }
void *aligned_alloc(size_t a, size_t n) { seen(n); return __libc_memalign(a, n); }
int posix_memalign(void **p, size_t a, size_t n) {
    seen(n); *p = __libc_memalign(a, n); return *p ? 0 : 12;
}
"""


def chain_config(root: Path, promote: bool) -> dict[str, Any]:
    return {"chain": [
        {"name": "ram", "backend": "host", "capacity": "4GiB", "promote": promote},
        {"name": "disk", "backend": "fs", "url": f"file://{root}"},
    ]}


def seed(root: Path, blocks: int, size: int) -> list[bytes]:
    keys = [b"promoted-%04d" % i for i in range(blocks)]
    with open_chain(chain_config(root, True), namespace=NAMESPACE) as chain:
        payloads = [os.urandom(size) for _ in keys]
        flags, _, _ = chain.tiers[1].put_payloads(keys, payloads)
        assert all(flags)
    return keys


def one_read(
    root: Path, keys: list[bytes], size: int, promote: bool, how: str
) -> tuple[float, float]:
    """Wall and CPU seconds (every thread of the process) for one batch read and
    the promotions it starts, on a fresh chain."""
    with open_chain(chain_config(root, promote), namespace=NAMESPACE) as chain:
        outs = [bytearray(size) for _ in keys]
        start, cpu = time.perf_counter(), time.process_time()
        found = chain.get(keys, outs) if how == "get" else chain.get_bytes(keys)
        chain.flush()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert all(found)
        if promote:
            assert chain.lookup(keys) == [0] * len(keys)
    return elapsed, cpu


class _Counting:
    def __init__(self, module: Any, counts: Counter[str], names: tuple[str, ...]) -> None:
        self._module, self._counts, self._names = module, counts, names

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._module, name)
        if name not in self._names:
            return real

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._counts["hash passes"] += 1
            return real(*args, **kwargs)

        return counted


def count_work(
    root: Path, keys: list[bytes], size: int, promote: bool, how: str
) -> dict[str, float]:
    """Per block: hash passes, encodes, header parses and payload-sized allocations."""
    counts: Counter[str] = Counter()
    saved = {n: getattr(framing, n) for n in ("xxhash", "_xxh3copy", "parse_header",
                                              "encode_parts")}
    framing.xxhash = _Counting(saved["xxhash"], counts, ("xxh3_64_digest", "xxh3_64_intdigest"))
    if saved["_xxh3copy"] is not None:
        framing._xxh3copy = _Counting(saved["_xxh3copy"], counts, ("copy_xxh3_64",))
    for name, label in (("parse_header", "header parses"), ("encode_parts", "encodes")):
        real = saved[name]
        setattr(framing, name, lambda *a, _r=real, _l=label, **k: (
            counts.update([_l]), _r(*a, **k))[1])
    try:
        allocs = _allocations()
        with open_chain(chain_config(root, promote), namespace=NAMESPACE) as chain:
            outs = [bytearray(size) for _ in keys]
            counts.clear()
            before = allocs()
            chain.get(keys, outs) if how == "get" else chain.get_bytes(keys)
            chain.flush()
            after = allocs()
    finally:
        for name, value in saved.items():
            setattr(framing, name, value)
    n = len(keys)
    out = {label: counts[label] / n for label in ("hash passes", "encodes", "header parses")}
    if before is not None and after is not None:
        out["payload-sized allocations"] = (after - before) / n
    return out


def _allocations() -> Any:
    try:
        fn = ctypes.CDLL(None).kvtier_big_allocs
    except AttributeError:
        return lambda: None
    fn.restype = ctypes.c_long
    return fn


def _shim(workdir: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source, lib = workdir / "bigalloc.c", workdir / "bigalloc.so"
    source.write_text(_SHIM)
    done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(source)],
                          capture_output=True, check=False)
    return lib if done.returncode == 0 else None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    size = parse_size(args.block_size)
    report: dict[str, Any] = {"kvtier": os.path.dirname(kvtier.__file__), "blocks": args.blocks,
                              "block_size": size, "one_pass_copy": framing.checks_while_copying(),
                              "reads": {}}
    with tempfile.TemporaryDirectory(prefix="kvtier-promotion-") as tmp:
        root = Path(tmp) / "disk"
        keys = seed(root, args.blocks, size)
        if args.count_only:
            return {how: {str(p): count_work(root, keys, size, p, how) for p in (False, True)}
                    for how in ("get", "get_bytes")}
        for how in ("get", "get_bytes"):
            times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for _ in range(args.rounds):  # interleaved, so drift hits both alike
                for promote in (False, True):
                    times[promote].append(one_read(root, keys, size, promote, how))
            wall, cpu = ({p: statistics.median(t[k] for t in times[p]) for p in (False, True)}
                         for k in (0, 1))
            report["reads"][how] = {
                "get ms": wall[False] * 1e3, "get+promote ms": wall[True] * 1e3,
                "promote ms per block": (wall[True] - wall[False]) * 1e3 / args.blocks,
                "get CPU ms": cpu[False] * 1e3, "get+promote CPU ms": cpu[True] * 1e3,
                "promote CPU ms per block": (cpu[True] - cpu[False]) * 1e3 / args.blocks,
            }
        lib = _shim(Path(tmp))
        env = {**os.environ, "KVTIER_BIG_ALLOC": str(size)}
        if lib is not None:
            env["LD_PRELOAD"] = str(lib)
        child = subprocess.run(
            [sys.executable, __file__, "--count-only", "--blocks", str(args.blocks),
             "--block-size", str(size)], env=env, capture_output=True, text=True, check=True)
        counted = json.loads(child.stdout)
        for how in ("get", "get_bytes"):
            report["reads"][how]["per block, promote: false"] = counted[how]["False"]
            report["reads"][how]["per block, promoted"] = counted[how]["True"]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--block-size", default="2MiB")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--count-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    report = measure(args)
    if args.json or args.count_only:
        print(json.dumps(report, indent=2))
        return
    print(f"kvtier from {report['kvtier']}: {report['blocks']} x {report['block_size']} B, "
          f"fs -> host, one-pass copy {report['one_pass_copy']}")
    for how, row in report["reads"].items():
        print(f"{how}: get {row['get ms']:.2f} ms, get+promote {row['get+promote ms']:.2f} ms, "
              f"promotion {row['promote ms per block']:.3f} ms per block; CPU: get "
              f"{row['get CPU ms']:.2f} ms, get+promote {row['get+promote CPU ms']:.2f} ms, "
              f"promotion {row['promote CPU ms per block']:.3f} ms per block")
        for which in ("per block, promote: false", "per block, promoted"):
            figures = ", ".join(f"{k} {v:g}" for k, v in row[which].items())
            print(f"  {which}: {figures}")


if __name__ == "__main__":
    main()
