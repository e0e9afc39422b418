"""Group ``concurrency``: several threads at once lose nothing and mix nothing up."""

from __future__ import annotations

import random
import threading
from typing import ClassVar

from .base import KitBase, kit_group
from .data import block_for, describe, key_of, size_for

__all__ = ["ConcurrencyTests"]


@kit_group("concurrency")
class ConcurrencyTests(KitBase):
    """Runs when the backend declares ``thread_safe=True``.

    Each thread owns a range of keys it puts and never evicts, and all
    threads put, get and evict one shared range.  Block contents follow from
    the key, so every hit is checked as it happens, in whichever thread.
    """

    #: Threads hammering one instance at once.
    concurrency_threads: ClassVar[int] = 6
    #: Operations per thread.
    concurrency_steps: ClassVar[int] = 150

    def test_threads_on_overlapping_keys(self) -> None:
        store, limit, n = self.store, self.block_limit(), self.concurrency_threads
        shared = [key_of("shared", i) for i in range(16)]
        unknown = [key_of("absent", i) for i in range(4)]
        seed = self.rng.getrandbits(32)
        barrier = threading.Barrier(n)
        problems: list[str] = []
        owned: list[set[bytes]] = [set() for _ in range(n)]
        evicted: list[list[tuple[bytes, bytes]]] = [[] for _ in range(n)]

        def expect(key: bytes) -> bytes:
            return block_for(key, size_for(key, limit))

        def check_hits(thread: int, keys: list[bytes], got: list[bytes | None]) -> None:
            for key, data in zip(keys, got):
                if data is not None and data != expect(key):
                    problems.append(
                        f"thread {thread}: get({key!r}) returned {describe(expect(key), data)}"
                    )

        def worker(thread: int) -> None:
            rng = random.Random(seed + thread)
            own = [key_of(f"own{thread}", i) for i in range(self.concurrency_steps)]
            next_own = 0
            barrier.wait()  # start together: overlap is the point
            try:
                for _ in range(self.concurrency_steps):
                    op = rng.random()
                    if op < 0.3:
                        keys = own[next_own : next_own + rng.randint(1, 3)]
                        next_own += len(keys)
                        flags = store.put(keys, [expect(k) for k in keys], evicted[thread])
                        owned[thread].update(k for k, f in zip(keys, flags) if f)
                        if not all(flags):
                            problems.append(f"thread {thread}: put({keys!r}) answered {flags}")
                    elif op < 0.5:
                        keys = rng.sample(shared, rng.randint(1, 4))
                        store.put(keys, [expect(k) for k in keys], evicted[thread])
                    elif op < 0.8:
                        mine = rng.sample(sorted(owned[thread]), min(2, len(owned[thread])))
                        keys = rng.sample(shared, 3) + mine + [rng.choice(unknown)]
                        check_hits(thread, keys, store.get(keys))
                    elif op < 0.9:
                        store.evict(rng.sample(shared, rng.randint(1, 3)))
                    else:
                        found = store.lookup([rng.choice(unknown), *rng.sample(shared, 2)])
                        if found[0]:
                            problems.append(f"thread {thread}: lookup of a never-put key: True")
            except BaseException as exc:  # reported below, with the thread named
                problems.append(f"thread {thread} raised {exc!r}")

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600.0)  # a hang guard, not a performance assertion
        assert not any(t.is_alive() for t in threads), "threads still running: a deadlock?"
        assert not problems, "\n".join(problems[:10])
        reported: set[bytes] = set()
        for pairs in evicted:
            for key, data in pairs:
                assert data == expect(key), (
                    f"eviction of {key!r} reported {describe(expect(key), data)}"
                )
                reported.add(key)
        silent = self.caps.capacity is not None and not self.caps.reports_evictions
        for number, keys in enumerate(owned):
            ordered = sorted(keys - reported)
            for key, found in zip(ordered, store.get(ordered)):
                if found is None and silent:
                    continue
                assert found == expect(key), (
                    f"thread {number} put {key!r}, no put reported evicting it, but get returned "
                    f"{describe(expect(key), found)}"
                )
