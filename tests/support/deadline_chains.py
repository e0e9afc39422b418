"""A host tier over an ``fs`` tier on real files: the chain the deadline tests run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

#: A host capacity of four blocks of 1,000 bytes: a few more puts push one down to fs.
HOST_OF_FOUR = 4500


def host_over_fs(root: Path, write: str, host: int | str = "64KiB",
                 **fs: Any) -> dict[str, Any]:
    """The chain: ``ram`` (host, ``host`` bytes) over ``disk`` (fs at ``root``, 1 MiB,
    page-cache I/O, write policy ``write``), ``fs`` added to the disk's options."""
    return {"chain": [
        {"name": "ram", "backend": "host", "capacity": host},
        {"name": "disk", "backend": "fs", "url": f"file://{root}", "capacity": "1MiB",
         "direct_io": False, "write": write, **fs}]}


def wait_until(start: float, seconds: float) -> None:
    """Sleep until ``seconds`` after ``start`` (``time.monotonic``)."""
    time.sleep(max(0.0, start + seconds - time.monotonic()))
