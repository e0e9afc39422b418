"""The ``host`` backend's S3-FIFO: the paper's queues for equal sizes, scans, ghosts."""

from __future__ import annotations

import random
from collections import deque

import pytest
from host_blocks import block, k, open_host, put_as_the_paper_does, resident

from kvtier.spec import BytesLike


class PaperS3Fifo:
    """S3-FIFO of Yang et al. (SOSP 2023) in pages: S (10%), M and a ghost queue G."""

    def __init__(self, pages: int) -> None:
        self.pages, self.small = pages, max(1, pages // 10)
        self.s: deque[bytes] = deque()
        self.m: deque[bytes] = deque()
        self.g: deque[bytes] = deque()
        self.freq: dict[bytes, int] = {}

    def get(self, key: bytes) -> bool:
        if key not in self.freq:
            return False
        self.freq[key] = min(self.freq[key] + 1, 3)
        return True

    def put(self, key: bytes, evicted: list[bytes]) -> None:
        if self.get(key):
            return
        while len(self.s) + len(self.m) >= self.pages:
            self.evict(evicted)
        if key in self.g:
            self.g.remove(key)
            self.m.append(key)
        else:
            self.s.append(key)
        self.freq[key] = 0
        while len(self.g) > self.pages - self.small:
            self.g.popleft()

    def evict(self, evicted: list[bytes]) -> None:
        if self.s and (len(self.s) >= self.small or not self.m):
            key = self.s.popleft()
            if self.freq[key] > 0:
                self.freq[key] = 0
                self.m.append(key)
                return
            self.g.append(key)
        else:
            key = self.m.popleft()
            if self.freq[key] > 0:
                self.freq[key] -= 1
                self.m.append(key)
                return
        del self.freq[key]
        evicted.append(key)


@pytest.mark.parametrize(("seed", "pages"), [(0, 10), (1, 10), (2, 20), (3, 7)])
def test_s3fifo_matches_the_paper_for_equal_sizes(seed: int, pages: int) -> None:
    size = 100
    handle = open_host(pages * size, "s3fifo", prefault=0)
    paper = PaperS3Fifo(pages)
    rng = random.Random(seed)
    hot = [k(f"hot-{i}") for i in range(pages // 2)]
    cold = [k(f"cold-{i}") for i in range(5 * pages)]
    for _ in range(800):
        keys = [rng.choice(hot if rng.random() < 0.4 else cold) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.6:
            put_as_the_paper_does(handle, paper, keys, size)
        else:
            found = handle.get(keys)
            assert [data is not None for data in found] == [paper.get(key) for key in keys]
        assert resident(handle, hot + cold) == set(paper.s) | set(paper.m)
    assert handle.stats()["evictions"] > 100


def scan_hits(eviction: str) -> tuple[int, set[bytes]]:
    """Hits on a hot set re-read between scans of one-off blocks larger than the tier."""
    handle = open_host(8 * 1024, eviction, prefault=0)
    hot = [k(f"hot-{i}") for i in range(3)]
    handle.put(hot, [block(key, 1024) for key in hot], [])
    handle.get(hot)
    hits = 0
    for burst in range(10):
        for i in range(10):
            key = k(f"scan-{burst}-{i}")
            handle.put([key], [block(key, 1024)], [])
        for key, data in zip(hot, handle.get(hot), strict=True):
            if data is None:
                handle.put([key], [block(key, 1024)], [])  # as the chain would, after a miss
            else:
                assert data == block(key, 1024)
                hits += 1
    return hits, resident(handle, hot)


def test_s3fifo_resists_scans_where_lru_does_not() -> None:
    hits, left = scan_hits("s3fifo")
    assert hits == 30 and left == {k(f"hot-{i}") for i in range(3)}  # used twice: in M
    assert scan_hits("lru")[0] == 0


def test_a_ghost_comes_back_into_the_main_queue() -> None:
    size = 100
    handle = open_host(10 * size, "s3fifo", prefault=0)
    first = k("first")
    handle.put([first], [block(first, size)], [])
    flood = [k(f"flood-{i}") for i in range(10)]
    evicted: list[tuple[bytes, BytesLike]] = []
    handle.put(flood, [block(key, size) for key in flood], evicted)
    assert [key for key, _ in evicted] == [first]  # used once: gone from S, its key a ghost
    handle.put([first], [block(first, size, 1)], [])  # seen again: straight into M
    assert handle.get([first]) == [block(first, size, 1)]
    more = [k(f"more-{i}") for i in range(30)]
    for key in more:  # one-off blocks churn through S; M's block stays
        handle.put([key], [block(key, size)], [])
    assert first in resident(handle, [first])
    # S takes what M leaves; eviction takes from S while S holds its tenth or more
    assert handle.stats()["s3fifo_small_bytes"] == 9 * size
