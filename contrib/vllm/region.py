"""The rows of vLLM's primary (CPU) region that a secondary tier reads and fills."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["PrimaryRows"]


class PrimaryRows:
    """Chunk ``c`` of vLLM's primary region as a memoryview of its payload.

    vLLM's region has one row of ``row`` bytes per chunk; the first
    ``payload`` bytes of a row are the chunk's KV (the rest is padding).
    The views slice the region itself: the chain's first tier reads from,
    or writes into, vLLM's host memory with no staging copy.
    """

    def __init__(self, region: memoryview, row: int, payload: int) -> None:
        self.flat = region.cast("B")
        self.row, self.payload = row, payload
        #: chunks whose whole payload lies in the region
        self.count = max(0, (len(self.flat) - payload) // row + 1)

    def rows(self, chunk_ids: Iterable[Any]) -> list[memoryview]:
        row, size, flat = self.row, self.payload, self.flat
        return [flat[int(c) * row : int(c) * row + size] for c in chunk_ids]

    def fit(self, chunk_ids: Any, keys: int) -> bool:
        """Whether ``chunk_ids`` names one chunk of the region per key.

        A chunk id outside the region (past its last chunk, or negative)
        slices an empty or foreign row: a store would frame an empty payload
        and a load would read nowhere.  vLLM's own fs tier refuses such a
        job before any I/O, and so does the tier.
        """
        ids = np.asarray(chunk_ids, dtype=np.int64).reshape(-1)
        return len(ids) == keys and bool(((ids >= 0) & (ids < self.count)).all())

    def release(self) -> None:
        self.flat.release()
