"""What an ``fs`` tier holds, by this process's count, and what a put may write and evict.

:class:`Ledger` keeps the index (key -> stored size, least recently used
first), the bytes it adds up to, the room reserved for writes in flight and
the keys whose files are being deleted.  With ``eviction: s3fifo`` an
:class:`~kvtier.policies.S3Fifo` policy, fed keys and sizes, holds the order
instead and names the victims.  It does no I/O: the backend
(:mod:`kvtier.backends.fs`) calls it with its lock held, which is never held
during I/O, and does the reads, writes and deletes it decides.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from kvtier.policies import S3Fifo
from kvtier.spec import first_positions

__all__ = ["Ledger", "Victim"]

#: How long a put waits for other threads' writes to land and free room.
_LANDING_TIMEOUT = 30.0

#: An eviction victim: ``(key, None)`` for a stored block, ``(key, i)`` for
#: block ``i`` of the batch being put, pushed out by a later one before it
#: was written.
Victim = tuple[bytes, int | None]


class Ledger:
    """The index, the capacity and the room reserved; every method runs under the backend's lock."""

    def __init__(self, lock: threading.Lock) -> None:
        # notified whenever writes in flight land (or fail) and give back the
        # room they reserved
        self.landed = threading.Condition(lock)
        self.capacity: int | None = None
        # key -> stored size, least recently used first
        self.index: OrderedDict[bytes, int] = OrderedDict()
        self.used = 0
        # eviction: s3fifo with a capacity: the order of eviction (the index's order
        # is then only the order of arrival)
        self.policy: S3Fifo | None = None
        # bytes of writes in flight, counted against the capacity before they
        # land so that concurrent puts cannot overshoot it together
        self.reserved = 0
        # keys whose file is being deleted: a concurrent get that still reads
        # the file must not put them back into the index
        self.doomed: dict[bytes, int] = {}
        # deletions finished so far (batches): a read that overlapped one may
        # have seen a file that is gone now, see reconcile()
        self.deletions = 0
        self.evictions = 0
        self.evicted_bytes = 0
        self.found_on_disk = 0
        # with the capacity counted elsewhere (the fs pool, whose other processes evict
        # this namespace's blocks unseen): the most bytes the index keeps, the oldest
        # forgotten past it; those on disk still, a lookup or a get finds again
        self.bound: int | None = None

    def adopt(self, index: OrderedDict[bytes, int], eviction: str = "lru") -> None:
        """Start from ``index``, as found on disk at open, entering it in that order."""
        self.index = index
        self.used = sum(index.values())
        self.policy = None
        if eviction == "s3fifo" and self.capacity is not None:
            self.policy = S3Fifo(self.capacity)
            for key, size in index.items():
                self._enter(key, size)

    def admit(self, key: bytes, size: int) -> None:
        if key in self.index:
            self.use(key)
        else:
            self.index[key] = size
            self.used += size
            if self.policy is not None:
                self._enter(key, size)
            while self.bound is not None and self.used > self.bound and len(self.index) > 1:
                # not all of it can be on disk: else it grew without bound, an entry for
                # every block this process stored or found, whoever evicted it since
                self._drop(next(iter(self.index)))

    def use(self, key: bytes) -> None:
        """A use of ``key``, which the index holds."""
        if self.policy is not None:
            self.policy.access(key)
        else:
            self.index.move_to_end(key)

    def _enter(self, key: bytes, size: int) -> None:
        """Enter ``key`` in the policy, which never evicts here: the room was made by
        :meth:`plan`, and a block found on disk over the capacity is evicted by the
        next put, as under LRU."""
        assert self.policy is not None
        self.policy.enter(key, size)

    def _drop(self, key: bytes) -> None:
        size = self.index.pop(key, None)
        if size is not None:
            self.used -= size
            if self.policy is not None:
                self.policy.remove(key)

    def release(self, size: int) -> None:
        """Give back ``size`` bytes reserved for writes that landed or failed; wake the
        puts waiting for room."""
        self.reserved -= size
        self.landed.notify_all()

    def touch(self, keys: Sequence[bytes]) -> list[bool]:
        """Mark indexed keys as just used; answer which were indexed."""
        known = []
        index = self.index
        for key in keys:
            if key in index:
                self.use(key)
                known.append(True)
            else:
                known.append(False)
        return known

    def doom(self, keys: Sequence[bytes]) -> None:
        """Drop ``keys`` from the index while their files are deleted."""
        for key in keys:
            self._drop(key)
            self.doomed[key] = self.doomed.get(key, 0) + 1

    def undoom(self, keys: Sequence[bytes]) -> None:
        """The files of ``keys`` are deleted; wake the puts waiting to write them again."""
        for key in keys:
            left = self.doomed.pop(key) - 1
            if left:
                self.doomed[key] = left
        if keys:
            self.deletions += 1
        self.landed.notify_all()

    def reconcile(
        self, keys: Sequence[bytes], known: list[bool], sizes: Sequence[int | None], seen: int
    ) -> None:
        """Bring the index in line with what the store answered for ``keys``.

        ``seen`` is :attr:`deletions` when ``known`` was taken, before the
        reads.  If a deletion finished since, the answers may predate it: a
        file read just before it was deleted would be indexed as a block the
        tier holds (counted against the capacity, answered by lookups, found
        missing by every get), and one missing because it was deleted and
        then written again would be dropped from the index while on disk.
        Such answers are left alone; the next read or lookup asks again.
        """
        if seen != self.deletions:
            return
        for key, hit, size in zip(keys, known, sizes, strict=True):
            if size is None:
                # deleted by another process: a miss, and no longer counted
                if hit and key in self.index:
                    self._drop(key)
            elif key not in self.index and key not in self.doomed:
                # Written by another process.  Counting it may overshoot
                # the capacity; the next put evicts back under it (and
                # reports what it evicts, which a get could not).
                self.admit(key, size)
                self.found_on_disk += 1

    def plan(
        self, keys: Sequence[bytes], sizes: list[int], is_open: Callable[[], bool]
    ) -> tuple[list[bool], list[int], list[Victim], dict[bytes, int] | None]:
        """Decide what a put writes and what it evicts.

        Answers the provisional results, the batch positions to write, the
        victims in eviction order and, for a batch with repeated keys, each
        key's first position.  Space for the writes is reserved until they
        land, so that concurrent puts cannot overshoot the capacity together.
        ``is_open`` tells whether waiting for other writes to land still makes
        sense.
        """
        # A key whose file is being deleted is written only once it is gone:
        # else the deletion, already under way, could remove the new file
        # after the put was counted (a block indexed but not on disk).  The
        # wait comes before anything is reserved, so it holds up no one.
        while self.doomed and is_open() and any(key in self.doomed for key in keys):
            if not self.landed.wait(_LANDING_TIMEOUT):
                break
        n = len(keys)
        results = [False] * n
        index, cap = self.index, self.capacity
        first: dict[bytes, int] | None = None
        if n > 1:
            first = first_positions(keys)
            if len(first) == n:
                first = None  # no repeats: skip the fix-up at the end
        plan: list[int] = []
        head = 0  # plan[:head] were pushed out again by later blocks
        victims: list[Victim] = []
        for i, key in enumerate(keys):
            if first is not None and first[key] != i:
                continue
            if key in index:
                self.use(key)
                results[i] = True
                continue
            size = sizes[i]
            if cap is not None:
                if size > cap:
                    continue
                fits, head = self._make_room(size, cap, keys, sizes, plan, head, victims, is_open)
                if not fits:
                    continue
            plan.append(i)
            self.reserved += size
            results[i] = True
        self.evictions += len(victims)
        return results, plan[head:], victims, first

    def _make_room(
        self,
        size: int,
        cap: int,
        keys: Sequence[bytes],
        sizes: list[int],
        plan: list[int],
        head: int,
        victims: list[Victim],
        is_open: Callable[[], bool],
    ) -> tuple[bool, int]:
        """Evict until ``size`` more bytes fit under ``cap``; answer whether they do, and
        how many of ``plan``'s blocks are now pushed out again."""
        # Same outcome as putting the batch one block at a time: the
        # least recently used go first, earlier blocks of this batch last.
        index = self.index
        over = self.used + self.reserved + size - cap
        while over > 0:
            if index:
                vkey, vsize = self._victim()
                self.used -= vsize
                self.doomed[vkey] = self.doomed.get(vkey, 0) + 1
                victims.append((vkey, None))
            elif head < len(plan):
                vi = plan[head]
                head += 1
                vsize = sizes[vi]
                self.reserved -= vsize
                victims.append((keys[vi], vi))
            elif self.reserved and is_open():
                # The rest is held by other threads' writes in flight
                # (this batch's own are given back above).  Once they
                # land they can be evicted like any block; refusing
                # now would turn a block that fits into a False.
                # Batches waiting here hold no reservation, so they
                # never wait for each other.
                if not self.landed.wait(_LANDING_TIMEOUT):
                    break
                over = self.used + self.reserved + size - cap
                continue
            else:
                break
            over -= vsize
        return over <= 0, head

    def _victim(self) -> tuple[bytes, int]:
        """Take the next victim out of the index: the least recently used, or the one
        the policy evicts."""
        if self.policy is None:
            return self.index.popitem(last=False)
        key = self.policy.make_room(1)[0]  # one block evicted, after the moves it makes
        return key, self.index.pop(key)
