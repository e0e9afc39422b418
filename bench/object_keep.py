"""The ``object`` tier's put bookkeeping with keep marks: what a put adds under the lock.

An object put costs an S3 PUT (milliseconds); around it the instance does its
bookkeeping in process: the room check beside the kept blocks
(``KeptMarks.fitting``), the index's ``add``, and the trim that spares kept
victims (``kept.trim``).  This measures that bookkeeping alone, per put of
one block, against the index's plain ``add`` and ``trim`` (the path before
keep), in three regimes, each with the ``fifo`` and ``s3fifo`` indexes:

- **none**: no block kept (the put checks that there are no marks, nothing else);
- **aside**: ``--kept`` blocks kept, the newest (a victim now and then);
- **half**: half the blocks kept, so about every other victim the index
  picks is a kept block, put back, and the room taken from the next block.

Every put evicts one block (the index is full at ``--fill`` blocks).  Figures:
the median of ``--repeat`` runs of ``--puts`` puts, microseconds per put of
the process's CPU time.

    .venv/bin/python bench/object_keep.py --repeat 9
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from kvtier.backends.object.kept import KeptMarks, trim
from kvtier.backends.object.keys import Index, KeyIndex, S3FifoIndex

SIZE = 64 << 10


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


def fill(eviction: str, blocks: int) -> Index:
    index: Index = KeyIndex(blocks * SIZE) if eviction == "fifo" else S3FifoIndex(blocks * SIZE)
    for i in range(blocks):
        index.add(key(i), SIZE, 0.0)
    index.trim()
    return index


def run(eviction: str, regime: str, fill_blocks: int, kept: int, puts: int) -> float:
    """CPU microseconds per put's bookkeeping."""
    index = fill(eviction, fill_blocks)
    marks = KeptMarks()
    marks.budget = fill_blocks * SIZE
    lock = threading.Lock()
    kept = {"before": 0, "none": 0, "aside": kept, "half": fill_blocks // 2}[regime]
    for i in range(fill_blocks - kept, fill_blocks):
        entry = index.entry(key(i))
        assert entry is not None
        marks.mark(key(i), entry)
    plain = regime == "before"
    sizes = {}
    start = time.process_time()
    for n in range(fill_blocks, fill_blocks + puts):
        k = key(n)
        sizes[k] = SIZE
        if plain:  # as put did before keep
            with lock:
                done = [k]
                for t in [t for t in done if t in index] + [t for t in done if t not in index]:
                    index.add(t, SIZE, 0.0)
                victims = index.trim()
        else:
            todo = marks.fitting([k], sizes, fill_blocks * SIZE, lock)
            with lock:
                new = [t for t in todo if t not in index]
                for t in new:
                    index.add(t, SIZE, 0.0)
                victims, _ = trim(index, marks, new)
        del sizes[k]
        assert len(victims) <= 2, victims
    return (time.process_time() - start) / puts * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fill", type=int, default=4096, help="blocks the index holds")
    parser.add_argument("--kept", type=int, default=64, help="blocks kept")
    parser.add_argument("--puts", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    regimes = ("before", "none", "aside", "half")
    print(f"per put, us of CPU (median of {args.repeat}); {args.fill} blocks held, "
          f"{args.kept} kept, every put evicts one")
    print(f"{'eviction':<9}" + "".join(f"{r:>10}" for r in regimes))
    for eviction in ("fifo", "s3fifo"):
        figures = {r: statistics.median(run(eviction, r, args.fill, args.kept, args.puts)
                                        for _ in range(args.repeat)) for r in regimes}
        print(f"{eviction:<9}" + "".join(f"{figures[r]:>10.2f}" for r in regimes))


if __name__ == "__main__":
    main()
