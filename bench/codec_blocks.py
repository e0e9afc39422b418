"""Codec ratio and speed on blocks a kvtier ``fs`` tier has stored (real KV, e.g. from vLLM).

    python bench/codec_blocks.py DIR [--limit 64] [--levels -1,1,3,9] [--shuffle 0,2]
        [--json OUT.json]

Walks ``DIR`` (an ``fs`` tier's ``url`` path), reads every stored block
(``KVTB`` header, uncompressed payload), concatenates up to ``--limit``
payloads and runs the same measurement as the codec section of ``kvtier
bench`` on them, beside synthetic KV of the same size.  Stored blocks must
be uncompressed (a tier with ``codec: none``, the default).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
from pathlib import Path

import msgpack

from kvtier.block import framing
from kvtier.tierbench import Progress
from kvtier.tierbench.micro import run_codec

_PREFIX = struct.Struct("<4sH")


def payloads(root: Path, limit: int) -> list[bytes]:
    """Payloads of the uncompressed blocks found under ``root``, checked, at most ``limit``."""
    found = []
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            data = (Path(folder) / name).read_bytes()
            if data[:4] != framing.MAGIC or len(data) < _PREFIX.size:
                continue
            _, hlen = _PREFIX.unpack_from(data)
            fields = msgpack.unpackb(data[_PREFIX.size:_PREFIX.size + hlen], raw=True)
            namespace, key, codec = fields[1], fields[2], fields[4]
            if codec != framing.CODEC_NONE:
                continue
            out = bytearray(fields[6])
            framing.decode_into(data, namespace, key, memoryview(out), verify=True)
            found.append(bytes(out))
            if len(found) >= limit:
                return found
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--levels", default="-1,1,3,9")
    parser.add_argument("--shuffle", default="0,2", help="element widths: 2 for 16-bit KV, "
                        "4 for float32")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    blocks = payloads(args.root, args.limit)
    if not blocks:
        raise SystemExit(f"no uncompressed kvtier blocks under {args.root}")
    sample = b"".join(blocks)
    label = f"stored KV ({len(blocks)} blocks of {len(blocks[0])} B)"
    levels = [int(x) for x in args.levels.split(",")]
    shuffles = tuple(int(x) for x in args.shuffle.split(","))
    progress = Progress(3 * (len(shuffles) * len(levels) + 1))
    try:
        rows = run_codec(len(sample), levels, False, progress, samples={label: sample},
                         shuffles=shuffles)
    finally:
        progress.close()
    for r in rows:
        print(f"{r['data']:<40} {r['codec']:<4} level {r['level']:>3} shuffle {r['shuffle']}: "
              f"ratio {r['ratio']:.3f}, encode {r['encode_gbps']:.3f} GB/s, "
              f"decode {r['decode_gbps']:.3f} GB/s")
    if args.json:
        args.json.write_text(json.dumps({"source": str(args.root), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
