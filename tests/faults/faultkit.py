"""Shared pieces of the fault suite: ground-truth blocks, the figures file, RSS, waiting."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtier.testing.data import block_for

__all__ = ["Report", "block_for", "object_tier", "read_exact", "rss_bytes", "wait_for"]


class Report:
    """Figures of the fault tests, merged into one JSON object keyed by section.

    Read, merged and rewritten on every record: a section run again replaces
    its figures, sections from other runs stay (so the long and the CI run
    can fill one file).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.written = False

    def record(self, section: str, variant: str, **figures: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            data = {}
        data[section] = {"variant": variant, "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                        time.gmtime()),
                         **figures}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, self.path)
        self.written = True


def object_tier(server: Any, bucket: str, **extra: Any) -> dict[str, Any]:
    """An ``object`` tier entry on a :class:`seaweed.SeaweedServer`."""
    return {"name": "obj", "backend": "object", "bucket": bucket, "endpoint": server.endpoint,
            "access_key_id": server.access_key, "secret_access_key": server.secret_key,
            "region": server.region, "lookup_cache_ttl": 0, **extra}


def rss_bytes() -> int:
    """Resident set size of this process (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def read_exact(chain: Any, keys: list[bytes], sizes: list[int]) -> list[bytes | None]:
    """``chain.get`` into fresh buffers; a miss is None."""
    outs = [bytearray(s) for s in sizes]
    found = chain.get(keys, outs)
    return [bytes(o) if f else None for o, f in zip(outs, found)]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``condition``; a hang guard, never a performance assertion."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)
