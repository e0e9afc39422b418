"""Kept blocks of an ``object`` instance: retention marks, their budget, victims spared.

Marks live in the instance, as its capacity's index does (:mod:`.keys`): the
bound they protect from is counted per process (docs/shared-capacity.md), so
they are per process too.  A kept block stays in the index; when the index
picks it as a victim (its ``trim``), it is put back (``restore``) and the
index trims again, until the room is made of blocks not kept.  Another
writer of the namespace knows nothing of this instance's marks: its own
index may pick the block and delete it, and the next LIST here forgets the
mark with the block (:meth:`KeptMarks.sync`).

The budget: the instance's tenant's ``keep`` (its ``tenants`` rule), at most
the instance's bound, ``min(capacity, quota)``, so kept blocks cannot fill
it.  A put whose block only kept blocks could make room for is refused
before its upload (:meth:`KeptMarks.fitting`); one that still finds only kept
blocks to give room after it (marks made meanwhile by another thread) is
taken out again (:func:`spare` says so).  Without a capacity nothing evicts,
and the instance keeps no marks: a mark of a block held answers True.

The backend's lock guards every call here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import obstore
from obstore.store import S3Store

from kvtier.policies.sparing import spare_kept
from kvtier.policies.tenancy import parse_tenants
from kvtier.spec import Failed, first_positions
from kvtier.spec.base import Keep

from .faults import Bucket
from .keys import Index
from .tenancy import Tenancy

__all__ = ["Keeping", "KeptMarks", "spare", "trim"]

T = TypeVar("T")
R = TypeVar("R")


class KeptMarks:
    """Which blocks of an instance are kept (key -> size, last-modified), and the figures."""

    def __init__(self) -> None:
        self.budget = 0
        self.entries: dict[bytes, tuple[int, float]] = {}
        self.used = 0
        self.refused = 0  # marks refused for the budget
        self.spared = 0  # victims the index chose that were kept and put back

    def open(self, options: Mapping[str, Any], bound: int | None) -> None:
        keep = parse_tenants(options["tenants"]).rule(options["tenant"]).keep
        self.budget = 0 if bound is None else min(keep, bound)

    def __len__(self) -> int:
        return len(self.entries)

    def mark(self, key: bytes, entry: tuple[int, float]) -> bool:
        """Keep ``key`` (held: its size and last-modified epoch) within the budget."""
        if key in self.entries:
            return True
        if self.used + entry[0] > self.budget:
            self.refused += 1
            return False
        self.entries[key] = entry
        self.used += entry[0]
        return True

    def forget(self, key: bytes) -> None:
        """``key`` is no longer kept: released, expired, evicted by request, or gone."""
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.used -= entry[0]

    def fitting(self, keys: list[bytes], sizes: Mapping[bytes, int], bound: int | None,
                lock: threading.Lock) -> list[bytes]:
        """``keys`` whose blocks fit in ``bound`` beside the kept blocks (a kept key fits);
        the others only kept blocks could make room for."""
        if bound is None or not self.entries:
            return keys
        with lock:
            return [k for k in keys if k in self.entries or self.used + sizes[k] <= bound]

    def sync(self, index: Index) -> None:
        """Forget the marks of blocks the index no longer holds (a LIST did not find them)."""
        for key in [k for k in self.entries if k not in index]:
            self.forget(key)

    def stats(self) -> dict[str, int]:
        return {"kept_bytes": self.used, "kept_blocks": len(self.entries),
                "keep_refused": self.refused}


def spare(index: Index, marks: KeptMarks, victims: list[bytes]) -> tuple[list[bytes], bool]:
    """``victims`` (of ``index.trim()``) less the kept ones, which go back into the index,
    and the room they gave taken again from blocks not kept (the loop is
    :func:`~kvtier.policies.sparing.spare_kept`).

    ``(victims, False)`` where only kept blocks were left to give room: the index is
    then over its bound by what the caller's put added, and the caller takes that out.
    """
    gone, spared, placed = spare_kept(victims, marks.entries,
                                      lambda v: index.restore(v, *marks.entries[v]), index.trim)
    marks.spared += spared
    return gone, placed


def trim(index: Index, marks: KeptMarks, new: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """The victims of a put that added ``new`` blocks to ``index``, kept ones spared
    (:func:`spare`); and those of ``new`` taken out again (among the victims, to
    delete: refused) where only kept blocks could make their room."""
    victims, placed = spare(index, marks, index.trim())
    if placed:
        return victims, []
    taken = [key for key in new if key in index]
    for key in taken:
        index.forget(key)
    return victims + taken + spare(index, marks, index.trim())[0], taken


class Keeping(Keep):
    """The ``object`` backend's ``kvtier_keep`` (a mixin of its backend class)."""

    _lock: threading.Lock
    _index: Index | None
    _capacity: int | None
    _tenancy: Tenancy
    _bucket: Bucket
    _kept: KeptMarks

    def _live_store(self) -> S3Store:
        raise NotImplementedError

    def _path(self, key: bytes) -> str:
        raise NotImplementedError

    def _count(self, **amounts: int) -> None:
        raise NotImplementedError

    def _map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R | Failed[Exception]]:
        raise NotImplementedError

    def _expire(self, store: S3Store, keys: list[bytes]) -> None:
        raise NotImplementedError

    def _keep(self, keys: Sequence[bytes], keep: bool) -> list[bool | None]:
        store = self._live_store()
        unique = list(first_positions(keys))
        with self._lock:
            index = self._index if self._capacity is not None else None
            known = {} if index is None else {k: e for k in unique
                                              if (e := index.entry(k)) is not None}
        # a block not in the index: stored by another writer since the last LIST?
        ask = [k for k in unique if k not in known]
        heads = dict(zip(ask, self._map(lambda k: self._head(store, k), ask)))
        failed = [o.exc for o in heads.values() if isinstance(o, Failed)]
        if failed:
            raise self._bucket.fault(failed[0], "keep") from failed[0]
        now, after = time.time(), self._tenancy.after
        answers: dict[bytes, bool | None] = {}
        stale: list[bytes] = []
        with self._lock:
            bounded = self._index is not None and self._capacity is not None
            for key in unique:
                entry = known.get(key) or heads.get(key)
                assert not isinstance(entry, Failed)
                if entry is not None and after is not None and now - entry[1] >= after:
                    stale.append(key)  # expiry wins over keep
                    entry = None
                if entry is None or not bounded or not keep:
                    self._kept.forget(key)
                    answers[key] = None if entry is None else True
                else:
                    # a block another writer stored enters the index at the next LIST;
                    # its bytes count in the marks' from now on
                    answers[key] = self._kept.mark(key, entry)
        if stale:
            self._expire(store, stale)
        return [answers[k] for k in keys]

    def _head(self, store: S3Store, key: bytes) -> tuple[int, float] | None:
        """An object's size and last-modified epoch, None if it is missing."""
        self._count(heads=1)
        try:
            meta = obstore.head(store, self._path(key))
        except FileNotFoundError:
            return None
        return int(meta["size"]), meta["last_modified"].timestamp()
