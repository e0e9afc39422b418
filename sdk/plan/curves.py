"""Miss-ratio curves: LRU by stack distances, other policies through the host tier's code.

A request's blocks are reached in order; the leading run of hits is its
cached prefix (what an engine loads instead of computing), and every block
of the request is then a use: a hit refreshes it, a miss stores it.  Hits
before the first miss change nothing a policy holds, so this counts the same
prefix as looking every block up first.

LRU keeps, at every capacity C, the C most recently used blocks (its
inclusion property), so one pass finds every capacity's hits: a reference
hits at C exactly when its stack distance (distinct blocks used since its
last use, itself included) is at most C.  The distances come from a Fenwick
tree over reference times holding a one at each block's last use.  A
request's prefix at C is its leading references whose running maximum
distance is at most C.

Other policies are replayed at each capacity through
:func:`kvtier.policies.new_policy`, the objects the host tier evicts
with, with payloads that hold no bytes and weigh :data:`BLOCK_SCALE` each.

Belady's bound is the offline optimum of block hits (MIN with bypass: on a
miss the block whose next use is farthest, the new one included, is not
kept).  No policy hits more blocks, so it bounds every prefix ratio too.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.policies import new_policy

from .trace import Trace

__all__ = [
    "BLOCK_SCALE", "INFINITE", "Point", "belady_hits", "infinite_point", "lru_curve", "replay",
]

#: Capacity of the cache that never evicts.
INFINITE = -1
#: Bytes each replayed block weighs.  ARC scales ``p`` by integer divisions
#: of byte counts; at a megabyte a block they round as finely as the tier's
#: do with real KV blocks, where one-byte blocks would round ``p`` coarsely.
BLOCK_SCALE = 1 << 20


@dataclass(frozen=True)
class Point:
    """What one policy at one capacity (in blocks) does with a trace."""

    capacity: int
    references: int
    prefix_hits: int  # blocks in requests' cached prefixes
    prefix_tokens: int  # prompt tokens in those blocks: prefill saved
    block_hits: int  # references that found their block, prefix or not
    puts: int  # blocks stored: what a write-through tier below receives
    evictions: int  # blocks pushed out: what a write-back tier below receives

    @property
    def prefix_ratio(self) -> float:
        return self.prefix_hits / self.references if self.references else 0.0


class _Fenwick:
    __slots__ = ("tree",)

    def __init__(self, size: int) -> None:
        self.tree = array("l", bytes(8 * (size + 1)))

    def add(self, i: int, delta: int) -> None:
        tree, n = self.tree, len(self.tree)
        i += 1
        while i < n:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of positions 0..i."""
        tree, total = self.tree, 0
        i += 1
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total


def _distances(trace: Trace) -> tuple[list[int], list[int], list[int]]:
    """Each reference's stack distance, its request's running maximum, and its tokens.

    A first use has distance ``references + 1``: a miss at every capacity.
    """
    n = trace.references
    never = n + 1
    tree = _Fenwick(n)
    last: dict[int, int] = {}
    dist: list[int] = []
    running: list[int] = []
    tokens: list[int] = []
    t = 0
    for request in trace.requests:
        worst = 0
        for key, weight in zip(request.keys, request.tokens, strict=True):
            before = last.get(key)
            if before is None:
                d = never
            else:
                d = len(last) - tree.prefix(before) + 1
                tree.add(before, -1)
            tree.add(t, 1)
            last[key] = t
            worst = max(worst, d)
            dist.append(d)
            running.append(worst)
            tokens.append(weight)
            t += 1
    return dist, running, tokens


def lru_curve(trace: Trace, capacities: Sequence[int]) -> list[Point]:
    """LRU's point at every capacity, from one pass over the trace."""
    dist, running, tokens = _distances(trace)
    n = len(dist)
    hits_sorted = sorted(dist)
    order = sorted(range(n), key=running.__getitem__)
    run_sorted = [running[i] for i in order]
    cum_tokens = [0]
    for i in order:
        cum_tokens.append(cum_tokens[-1] + tokens[i])
    unique = trace.unique_blocks
    points = []
    for cap in capacities:
        bound = n if cap == INFINITE else min(cap, n)  # first uses are at n + 1: never hits
        block_hits = bisect_right(hits_sorted, bound)
        prefix = bisect_right(run_sorted, bound)
        puts = n - block_hits
        held = unique if cap == INFINITE else min(cap, unique)
        points.append(Point(cap, n, prefix, cum_tokens[prefix], block_hits, puts, puts - held))
    return points


def infinite_point(trace: Trace) -> Point:
    """The ceiling: a cache that keeps every block it ever saw (a set, no stack needed)."""
    seen: set[int] = set()
    prefix = tokens = block_hits = 0
    for request in trace.requests:
        leading = True
        for key, weight in zip(request.keys, request.tokens, strict=True):
            if key in seen:
                block_hits += 1
                if leading:
                    prefix += 1
                    tokens += weight
            else:
                leading = False
                seen.add(key)
    refs = trace.references
    return Point(INFINITE, refs, prefix, tokens, block_hits, refs - block_hits, 0)


def replay(trace: Trace, eviction: str, capacity: int) -> Point:
    """Replay ``trace`` through the host tier's ``eviction`` policy at ``capacity`` blocks."""
    # keys are ints (hashable as bytes are), blocks weigh BLOCK_SCALE bytes each
    policy: Any = new_policy(eviction, capacity * BLOCK_SCALE)
    access, admit = policy.access, policy.admit
    prefix = tokens = block_hits = puts = 0
    lookup = policy.holds if eviction == "adaptive" else None  # as an engine asks first
    for request in trace.requests:
        leading = True
        if lookup is not None:
            lookup(request.keys)
        for key, weight in zip(request.keys, request.tokens, strict=True):
            if access(key):
                block_hits += 1
                if leading:
                    prefix += 1
                    tokens += weight
            else:
                leading = False
                admit(key, BLOCK_SCALE)
                puts += 1
    return Point(capacity, trace.references, prefix, tokens, block_hits, puts, policy.evictions)


def belady_hits(trace: Trace, capacity: int) -> int:
    """Block hits of the offline optimum (MIN with bypass) at ``capacity`` blocks."""
    keys = [key for request in trace.requests for key in request.keys]
    never = len(keys)
    following = [never] * len(keys)
    seen: dict[int, int] = {}
    for t in range(len(keys) - 1, -1, -1):
        following[t] = seen.get(keys[t], never)
        seen[keys[t]] = t
    cached: dict[int, int] = {}  # key -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, key), stale entries skipped
    hits = 0
    for t, key in enumerate(keys):
        nxt = following[t]
        if key in cached:
            hits += 1
        elif nxt == never or capacity <= 0:
            continue
        elif len(cached) >= capacity:
            while cached.get(heap[0][1]) != -heap[0][0]:
                heapq.heappop(heap)
            if -heap[0][0] <= nxt:
                continue  # the new block is used last: keeping it cannot gain
            del cached[heapq.heappop(heap)[1]]
        cached[key] = nxt
        heapq.heappush(heap, (-nxt, key))
    return hits
