"""Per-tier counters and latency histograms, cheap enough for the data path.

One lock per tier guards plain ints; it is taken once per batch, not per
block.  Latencies go into power-of-two microsecond buckets, enough for
p50/p99 within a factor of two without keeping samples.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from time import perf_counter
from typing import Any

from kvtier.observe import phases

__all__ = ["LatencyHistogram", "TierStats"]

_BUCKETS = 32  # 1 us .. ~36 min


class LatencyHistogram:
    """Counts of batch latencies in power-of-two microsecond buckets."""

    __slots__ = ("count", "counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.count = 0
        self.total = 0.0

    def add(self, seconds: float) -> None:
        micros = int(seconds * 1e6)
        self.counts[min(micros.bit_length(), _BUCKETS - 1)] += 1
        self.count += 1
        self.total += seconds

    def quantile(self, q: float) -> float:
        """Upper bound, in seconds, of the bucket holding quantile ``q``."""
        if not self.count:
            return 0.0
        rank = q * self.count
        seen = 0
        for bucket, n in enumerate(self.counts):
            seen += n
            if seen >= rank and n:
                return float(1 << bucket) / 1e6
        return float(1 << (_BUCKETS - 1)) / 1e6

    def summary(self) -> dict[str, float]:
        mean = self.total / self.count if self.count else 0.0
        return {
            "count": self.count,
            "mean_s": mean,
            "p50_s": self.quantile(0.5),
            "p99_s": self.quantile(0.99),
        }


@dataclass
class TierStats:
    """What the chain counts for one tier."""

    hits: int = 0
    misses: int = 0
    puts: int = 0  # blocks stored (including skipped duplicates)
    refused: int = 0  # blocks the backend answered False for (too large, no room, a block fault)
    failed: int = 0  # blocks of puts that raised or met the tier's write back-off
    bytes_in: int = 0  # payload bytes written to the tier
    bytes_out: int = 0  # payload bytes served from the tier
    errors: int = 0  # backend faults (exceptions)
    corrupt: int = 0  # blocks that failed a format or checksum check
    size_mismatch: int = 0  # sound blocks of another size than the reader's buffer (kept)
    evictions: int = 0  # blocks pushed out by capacity
    demoted: int = 0  # blocks written here on eviction from the tier above
    promoted: int = 0  # blocks copied here from a tier below on a hit
    dropped: int = 0  # asynchronous writes abandoned (tier unhealthy)
    not_admitted: int = 0  # blocks not written here: their keys seen fewer times than admit
    sample_admitted: int = 0  # blocks written here by admit_sample alone: seen too few times
    keep_refused: int = 0  # keep marks refused: beyond the tenant's retention budget
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    latency: dict[str, LatencyHistogram] = field(default_factory=dict, repr=False)

    def add(self, **deltas: int) -> None:
        with self.lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    @contextmanager
    def timed(self, op: str) -> Iterator[None]:
        start = perf_counter()
        try:
            yield
        finally:
            elapsed = perf_counter() - start
            phases.span(f"backend {op}", start, start + elapsed)
            with self.lock:
                hist = self.latency.get(op)
                if hist is None:
                    hist = self.latency[op] = LatencyHistogram()
                hist.add(elapsed)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            out: dict[str, Any] = {
                f.name: getattr(self, f.name)
                for f in fields(self)
                if f.name not in ("lock", "latency")
            }
            out["latency"] = {op: h.summary() for op, h in self.latency.items()}
        return out
