"""How long an fs tier holding many blocks takes to reopen, and the memory it takes.

    python bench/fs_reopen.py [--blocks 1000000] [--dir DIR] [--keep] [--json]

Creates ``--blocks`` small blocks (64-byte payloads in the block format,
written straight into the fs layout: one file each, in the tier's
``<hex[0:2]>/<hex[2:4]>`` leaves), then times, each in a fresh process:

* ``scan``: open with no index file, which walks the tree and stats every
  block (and the close after it, which writes the index);
* ``index``: open with the index that close wrote, every leaf unchanged;
* ``crash``: open after blocks were written into 1% of the leaves after the
  index was saved and the writer never closed (a crash): those leaves are
  rescanned, the rest trusted.

For each: wall time of ``kvtier_open``, the blocks and bytes the tier then
reports (checked against what was created), the leaves rescanned, and the
process's peak RSS (``ru_maxrss``) before and after the open.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvtier import Namespace
from kvtier.block.framing import Codec, encode

NAMESPACE = Namespace("fs-reopen-bench", dtype="bfloat16", tokens_per_block=16)
PAYLOAD = 64


def key_of(i: int) -> bytes:
    # 16 bytes like a chain's keys, spread over every leaf by the first two bytes
    return (i * 2654435761 % (1 << 32)).to_bytes(4, "little") + i.to_bytes(12, "big")


def create(root: Path, count: int, start: int = 0) -> int:
    """Write blocks ``start .. start+count`` into the layout; answer the bytes written."""
    nsroot = root / NAMESPACE.hex
    nsroot.mkdir(parents=True, exist_ok=True)
    made: set[str] = set()
    total = 0
    codec = Codec()
    payload = bytes(range(PAYLOAD))
    for i in range(start, start + count):
        key = key_of(i)
        h = key.hex()
        leaf = f"{nsroot}/{h[0:2]}/{h[2:4]}"
        if leaf not in made:
            os.makedirs(leaf, exist_ok=True)
            made.add(leaf)
        data = encode(NAMESPACE.fingerprint, key, payload, codec)
        fd = os.open(f"{leaf}/{h}.kvb", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        total += len(data)
    return total


def child(root: str, close: bool) -> None:
    """Open the tier, print what it took as JSON (run in a fresh process)."""
    from kvtier.plugins.registry import default_registry

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    handle = default_registry().create("fs")
    options = {"url": f"file://{root}", "capacity": None, "fsync": False, "concurrency": 4,
               "storage_options": {}}
    start = time.perf_counter()
    handle.open(options, NAMESPACE.hex)
    opened = time.perf_counter() - start
    stats = dict(handle.stats())
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    closed = None
    if close:
        start = time.perf_counter()
        handle.close()
        closed = time.perf_counter() - start
    print(json.dumps({"open_s": opened, "close_s": closed, "blocks": stats["blocks"],
                      "used_bytes": stats["used_bytes"],
                      "leaves_rescanned": stats["leaves_rescanned"],
                      "rss_before_mib": before / 1024, "rss_after_mib": after / 1024}))
    if not close:
        os._exit(0)  # no close: what a crash leaves


def run_child(root: Path, close: bool = True) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", str(root)]
                         + ([] if close else ["--no-close"]),
                         capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=None, help="where to build the tier")
    parser.add_argument("--keep", action="store_true",
                        help="leave the blocks behind; a later run with the same --dir and "
                             "--blocks reuses them")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-close", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, not args.no_close)
        return
    root = args.dir or Path(tempfile.mkdtemp(prefix="kvtier-fs-reopen-"))
    report: dict[str, Any] = {"blocks": args.blocks, "payload": PAYLOAD}
    try:
        start = time.perf_counter()
        if (root / NAMESPACE.hex / "ready").exists():  # --keep left one of this size
            total = args.blocks * len(encode(NAMESPACE.fingerprint, key_of(0), bytes(PAYLOAD),
                                             Codec()))
        else:
            total = create(root, args.blocks)
        report["create_s"] = time.perf_counter() - start
        report["bytes"] = total
        (root / NAMESPACE.hex / "index.kvi").unlink(missing_ok=True)
        report["scan"] = run_child(root)
        report["index"] = run_child(root)
        # a crash: blocks land in 1% of the leaves after the index was saved
        extra = max(1, 65536 // 100)
        report["crash_blocks"] = extra
        report["crash_bytes"] = create(root, extra, start=args.blocks)
        report["crash"] = run_child(root)
        if args.keep:
            for i in range(args.blocks, args.blocks + extra):  # back to the state created
                h = key_of(i).hex()
                os.unlink(root / NAMESPACE.hex / h[0:2] / h[2:4] / f"{h}.kvb")
            (root / NAMESPACE.hex / "ready").write_text(str(args.blocks))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    for name, want_blocks, want_bytes in (
            ("scan", args.blocks, total), ("index", args.blocks, total),
            ("crash", args.blocks + extra, total + report["crash_bytes"])):
        r = report[name]
        r["right"] = r["blocks"] == want_blocks and r["used_bytes"] == want_bytes
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.blocks:,} blocks of {PAYLOAD} B payload ({total / 1e6:.0f} MB of files), "
          f"created in {report['create_s']:.1f} s")
    print("| open | s | blocks | capacity right | leaves rescanned | RSS MiB (before -> after) "
          "| close s |")
    print("|---|--:|--:|---|--:|--:|--:|")
    for name in ("scan", "index", "crash"):
        r = report[name]
        close = "-" if r["close_s"] is None else f"{r['close_s']:.2f}"
        print(f"| {name} | {r['open_s']:.2f} | {r['blocks']:,} | {'yes' if r['right'] else 'NO'} "
              f"| {r['leaves_rescanned']} | {r['rss_before_mib']:.0f} -> "
              f"{r['rss_after_mib']:.0f} | {close} |")


if __name__ == "__main__":
    main()
