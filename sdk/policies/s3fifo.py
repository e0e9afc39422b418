"""``s3fifo``: S3-FIFO (Yang et al., SOSP 2023), frequency-aware, in bytes.

The host tier runs it; the fs tier's index (:mod:`kvtier.backends.fs.capacity`)
and the object tier's (:mod:`kvtier.backends.object.keys`) hold one too, and
the fs pool writes it in SQL (:mod:`kvtier.backends.fs.pool_policy`, its
constants taken from :class:`S3Fifo` and its decisions checked against it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .base import Accounting, Ghosts

__all__ = ["S3Fifo"]


class S3Fifo(Accounting):
    """S3-FIFO: three FIFO queues, in bytes.

    A new block enters the small queue S (a tenth of the capacity); a key
    found among the ghosts G enters the main queue M instead.  Each use
    raises a block's count, at most 3, and moves nothing.  To make room, S's
    oldest goes to M if it was used again while in S, else it is evicted and
    its key joins G (keys only, at most M's share of the capacity); when S is
    within its share, M's oldest is reinserted with its count lowered while
    the count is above 0, else evicted.  Most KV blocks are used once (the
    tail of a one-off prompt): they leave from S after a tenth of the
    capacity, while blocks seen twice live in M.
    """

    name = "s3fifo"
    #: S's share of the capacity, as the paper's 10%.
    SMALL_DIVISOR = 10
    #: Highest use count, as the paper's two bits.
    MAX_FREQ = 3

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._small: OrderedDict[bytes, int] = OrderedDict()
        self._main: OrderedDict[bytes, int] = OrderedDict()
        self._small_bytes = 0
        self._small_target = max(1, capacity // self.SMALL_DIVISOR)
        self._freq: dict[bytes, int] = {}
        self._ghosts = Ghosts()

    def __len__(self) -> int:
        return len(self._freq)

    def holds(self, keys: Sequence[bytes]) -> list[bool]:
        freq = self._freq  # every key held has a count
        return [key in freq for key in keys]

    def size(self, key: bytes) -> int | None:
        size = self._small.get(key)
        return size if size is not None else self._main.get(key)

    def held(self) -> list[tuple[bytes, int]]:
        return [*self._small.items(), *self._main.items()]

    def access(self, key: bytes) -> bool:
        freq = self._freq.get(key)
        if freq is None:
            return False
        if freq < self.MAX_FREQ:
            self._freq[key] = freq + 1
        return True

    def enter(self, key: bytes, size: int) -> None:
        if key in self._ghosts.keys:
            self._ghosts.discard(key)
            self._main[key] = size
        else:
            self._small[key] = size
            self._small_bytes += size
        self._freq[key] = 0
        self.used += size
        self._trim()

    def remove(self, key: bytes) -> bool:
        size = self._small.pop(key, None)
        if size is not None:
            self._small_bytes -= size
        else:
            size = self._main.pop(key, None)
            if size is None:
                return False
        self.used -= size
        del self._freq[key]
        return True

    def resize(self, key: bytes, size: int) -> None:
        old = self._small.get(key)
        if old is not None:
            self._small[key] = size
            self._small_bytes += size - old
        else:
            old = self._main[key]
            self._main[key] = size
        self.used += size - old

    def stats(self) -> dict[str, int]:
        return {"s3fifo_small_bytes": self._small_bytes}

    def _evict_one(self) -> bytes | None:
        """One step of the paper's EVICT: a block moved or reinserted (None), or one evicted."""
        if self._small and (self._small_bytes >= self._small_target or not self._main):
            key, size = self._small.popitem(last=False)
            self._small_bytes -= size
            if self._freq[key] > 0:  # used again while in S: worth a place in M
                self._freq[key] = 0
                self._main[key] = size
                return None
            self._ghosts.add(key, size)
        else:
            key, size = self._main.popitem(last=False)
            freq = self._freq[key]
            if freq > 0:
                self._freq[key] = freq - 1
                self._main[key] = size
                return None
        del self._freq[key]
        self.used -= size
        return key

    def _trim(self) -> None:
        ghosts, limit = self._ghosts, self.capacity - self._small_target
        while ghosts.keys and ghosts.bytes > limit:
            ghosts.drop_oldest()
