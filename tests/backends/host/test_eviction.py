"""The ``host`` backend's eviction order: LRU against a reference, ARC against the paper."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

import pytest
from host_blocks import block, k, open_host, put_as_the_paper_does, resident

from kvtier.spec import BytesLike

# --- eviction order --------------------------------------------------------------


class ReferenceLru:
    """The LRU the host backend must match exactly."""

    def __init__(self, capacity: int, limit: int) -> None:
        self.capacity, self.limit = capacity, limit
        self.blocks: OrderedDict[bytes, bytes] = OrderedDict()

    def used(self) -> int:
        return sum(map(len, self.blocks.values()))

    def put(
        self, keys: Sequence[bytes], blocks: Sequence[bytes], evicted: list[object]
    ) -> list[bool]:
        out = []
        first: dict[bytes, bool] = {}
        for key, data in zip(keys, blocks, strict=True):
            if key in first:  # a key repeated in one put: its first occurrence counts alone
                out.append(first[key])
                continue
            if key in self.blocks:
                self.blocks.move_to_end(key)
                out.append(True)
            elif len(data) > self.limit:
                out.append(False)
            else:
                while self.used() + len(data) > self.capacity:
                    evicted.append(self.blocks.popitem(last=False))
                self.blocks[key] = data
                out.append(True)
            first[key] = out[-1]
        return out

    def get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        out = []
        for key in keys:
            data = self.blocks.get(key)
            if data is not None:
                self.blocks.move_to_end(key)
            out.append(data)
        return out


def test_lru_order_matches_reference_model() -> None:
    capacity, limit = 5000, 2000
    handle = open_host(capacity, "lru", max_block_size=limit)
    model = ReferenceLru(capacity, limit)
    rng = random.Random(11)
    pool = [k(i) for i in range(30)]
    for step in range(800):
        keys = [rng.choice(pool) for _ in range(rng.randint(0, 5))]
        op = rng.choice(["put", "put", "get", "get_into", "lookup", "evict"])
        if op == "put":
            blocks = [block(key, rng.choice([0, 10, 400, 1000, 1999, 2001]), step) for key in keys]
            got_ev: list[tuple[bytes, BytesLike]] = []
            want_ev: list[object] = []
            assert list(handle.put(keys, blocks, got_ev)) == model.put(keys, blocks, want_ev)
            assert got_ev == want_ev
        elif op == "get":
            assert list(handle.get(keys)) == model.get(keys)
        elif op == "get_into":
            want = model.get(keys)
            bufs = [[memoryview(bytearray(len(d) if d is not None else 1))] for d in want]
            sizes = handle.get_into(keys, bufs)
            assert list(sizes) == [None if d is None else len(d) for d in want]
            for d, buf in zip(want, bufs, strict=True):
                if d is not None:
                    assert bytes(buf[0]) == d
        elif op == "lookup":
            assert list(handle.lookup(keys)) == [key in model.blocks for key in keys]
        else:
            want_gone = []
            for key in keys:
                want_gone.append(model.blocks.pop(key, None) is not None)
            assert list(handle.evict(keys)) == want_gone
        stats = handle.stats()
        assert stats["used_bytes"] == model.used() <= capacity
        assert stats["blocks"] == len(model.blocks)
        assert resident(handle, pool) == set(model.blocks)


def scan_workload(eviction: str) -> tuple[int, set[bytes]]:
    """A hot working set re-read between bursts of one-off blocks (a long scan)."""
    handle = open_host(8 * 1024, eviction)
    hot = [k(f"hot-{i}") for i in range(3)]
    hot_blocks = [block(key, 1024) for key in hot]
    handle.put(hot, hot_blocks, [])
    handle.get(hot)
    hits = 0
    for burst in range(10):
        scan = [k(f"scan-{burst}-{i}") for i in range(10)]  # more than the tier holds
        for key in scan:
            handle.put([key], [block(key, 1024)], [])
        got = handle.get(hot)
        for key, data, want in zip(hot, got, hot_blocks, strict=True):
            if data is None:
                handle.put([key], [want], [])  # as the chain would, after a miss
            else:
                assert data == want
                hits += 1
    survivors = resident(handle, hot + [k(f"scan-9-{i}") for i in range(10)])
    return hits, survivors


def test_arc_resists_scans_where_lru_does_not() -> None:
    lru_hits, lru_left = scan_workload("lru")
    arc_hits, arc_left = scan_workload("arc")
    hot = {k(f"hot-{i}") for i in range(3)}
    assert lru_hits == 0  # every burst flushes the hot set under LRU
    assert arc_hits == 30  # ARC serves the hot set every time
    assert hot <= arc_left
    assert arc_left - hot == {k(f"scan-9-{i}") for i in range(5, 10)}
    assert hot <= lru_left  # re-put after the last miss, so recent again
    assert lru_left - hot == {k(f"scan-9-{i}") for i in range(5, 10)}


def test_arc_ghost_hits_adapt_p() -> None:
    handle = open_host(400, "arc")
    blk = {key: key * 100 for key in (b"A", b"B", b"C", b"D", b"E", b"F")}

    def put(key: bytes) -> list[tuple[bytes, BytesLike]]:
        evicted: list[tuple[bytes, BytesLike]] = []
        assert list(handle.put([key], [blk[key]], evicted)) == [True]
        return evicted

    handle.put([b"A", b"B", b"C", b"D"], [blk[x] for x in (b"A", b"B", b"C", b"D")], [])
    handle.get([b"D"])  # T1 = A B C, T2 = D
    assert put(b"E") == [(b"A", blk[b"A"])]  # A leaves a ghost in B1
    assert handle.stats()["arc_p"] == 0
    # a ghost hit in B1: T1 was too small, so its target grows by A's size,
    # A comes back into T2, and T1 (above its target) gives up its oldest
    assert put(b"A") == [(b"B", blk[b"B"])]
    assert handle.stats()["arc_p"] == 100
    handle.get([b"C", b"E"])  # T1 empty, T2 = D A C E
    assert put(b"F") == [(b"D", blk[b"D"])]  # T1 was empty: T2's oldest goes, ghost in B2
    # a ghost hit in B2 shrinks the target back; T1 (at its target) gives up F
    assert put(b"D") == [(b"F", blk[b"F"])]
    assert handle.stats()["arc_p"] == 0
    assert resident(handle, list(blk)) == {b"A", b"C", b"D", b"E"}
    assert handle.stats()["used_bytes"] == 400 and handle.stats()["evictions"] == 4


def test_arc_full_t1_keeps_no_ghost() -> None:
    # |T1| = c leaves no room for B1 (|T1| + |B1| <= c): a re-put is a plain miss
    handle = open_host(400, "arc")
    for key in (b"A", b"B", b"C", b"D", b"E"):
        handle.put([key], [key * 100], [])
    handle.put([b"A"], [b"A" * 100], [])
    assert handle.stats()["arc_p"] == 0
    assert resident(handle, [b"A", b"B", b"C", b"D", b"E"]) == {b"A", b"C", b"D", b"E"}


class PaperArc:
    """ARC as in Megiddo & Modha's Fig. 4, over pages of ``size`` bytes, p in bytes.

    Written from the paper's four cases, independently of the backend's byte
    form (which makes room in a loop and trims ghosts afterwards): with equal
    block sizes the two must agree on every eviction and on p.
    """

    def __init__(self, pages: int, size: int) -> None:
        self.c, self.size, self.p = pages, size, 0
        self.t1: OrderedDict[bytes, None] = OrderedDict()
        self.t2: OrderedDict[bytes, None] = OrderedDict()
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()

    def get(self, x: bytes) -> None:
        if x in self.t1:  # Case I
            del self.t1[x]
            self.t2[x] = None
        elif x in self.t2:
            self.t2.move_to_end(x)

    def put(self, x: bytes, evicted: list[bytes]) -> None:
        if x in self.t1 or x in self.t2:
            self.get(x)
            return
        b1, b2, s = len(self.b1), len(self.b2), self.size
        if x in self.b1:  # Case II
            self.p = min(self.p + (s if b1 >= b2 else s * b2 // b1), self.c * s)
            self._replace(x, evicted)
            del self.b1[x]
            self.t2[x] = None
            return
        if x in self.b2:  # Case III
            self.p = max(self.p - (s if b2 >= b1 else s * b1 // b2), 0)
            self._replace(x, evicted)
            del self.b2[x]
            self.t2[x] = None
            return
        l1 = len(self.t1) + b1  # Case IV
        total = l1 + len(self.t2) + b2
        if l1 == self.c:
            if len(self.t1) < self.c:
                self.b1.popitem(last=False)
                self._replace(x, evicted)
            else:
                evicted.append(self.t1.popitem(last=False)[0])
        elif total >= self.c:
            if total == 2 * self.c:
                self.b2.popitem(last=False)
            self._replace(x, evicted)
        self.t1[x] = None

    def _replace(self, x: bytes, evicted: list[bytes]) -> None:
        t1 = len(self.t1) * self.size
        if self.t1 and ((x in self.b2 and t1 == self.p) or t1 > self.p):
            key = self.t1.popitem(last=False)[0]
            self.b1[key] = None
        else:
            key = self.t2.popitem(last=False)[0]
            self.b2[key] = None
        evicted.append(key)


@pytest.mark.parametrize("seed", range(4))
def test_arc_matches_the_paper_for_equal_sizes(seed: int) -> None:
    pages, size = 8, 100
    handle = open_host(pages * size, "arc")
    paper = PaperArc(pages, size)
    rng = random.Random(seed)
    hot = [k(f"hot-{i}") for i in range(6)]
    cold = [k(f"cold-{i}") for i in range(40)]
    for _ in range(600):
        keys = [rng.choice(hot if rng.random() < 0.5 else cold) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.6:
            put_as_the_paper_does(handle, paper, keys, size)
        else:
            handle.get(keys)
            for key in keys:
                paper.get(key)
        assert handle.stats()["arc_p"] == paper.p
        assert resident(handle, hot + cold) == set(paper.t1) | set(paper.t2)
