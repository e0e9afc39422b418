"""A base class that implements the contract's rules once.

:class:`BlockStore` carries the required and lifecycle hooks of
:mod:`kvtier.spec.hookspecs` as ``@hookimpl`` methods and keeps, for every
backend built on it, the rules those hooks share:

* the lifecycle: a new instance, ``kvtier_open`` once, ``kvtier_close``
  (idempotent); every hook but ``kvtier_options`` and ``kvtier_close``
  raises :class:`~kvtier.spec.ClosedError` after close, and the data hooks
  before open too;
* ``kvtier_capabilities`` answered before open (for the default options);
* batches: one block (or buffer) per key, checked, and an empty batch
  answered without calling the backend;
* a key repeated in one put: only its first occurrence reaches the backend,
  and every occurrence gets the answer of the first.

A subclass writes ``_open``, ``_close``, ``_capabilities``, ``_put``,
``_get``, ``_lookup`` and ``_evict`` (and ``_stats`` if it has figures),
each called only while the instance is open and with a non-empty batch.
The optional fast paths are mixins a backend adds only when it has them, so
that it is not reported as having a hook it lacks: :class:`PutParts`,
:class:`GetInto`, :class:`Scan` and :class:`Keep`.  Raw access for the conformance kit is
no hook: a plain method ``kit_tamper`` (:class:`kvtier.testing.RawAccess`);
the mixin ``Tamper`` that made the old hook is importable from here for one
release (:mod:`kvtier.spec.deprecated`).

The base makes no lock of its own for the data path: it checks the state
on entry, so a call racing ``close`` may still reach the backend, which
then raises ``ClosedError`` itself (``self.closed_error()`` words it).

A backend that does not use the base is held to the same rules by the
conformance kit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, MutableSequence, Sequence
from typing import Any, ClassVar

from .batch import check_batch, first_positions
from .deprecated import Tamper
from .errors import ClosedError, KvtierError
from .hookspecs import BytesLike, hookimpl
from .types import Capabilities, Option, ScanEntry

__all__ = ["BlockStore", "Evicted", "Expire", "GetInto", "Keep", "PutParts", "Scan", "Tamper"]

#: Where ``_put`` reports the blocks its capacity pushed out.
Evicted = MutableSequence[tuple[bytes, BytesLike]]

_NEW, _OPEN, _CLOSED = "new", "open", "closed"


class BlockStore:
    """Base of a backend: lifecycle, batch checks and repeated keys, once.

    Class attributes a subclass sets:

    * ``name``: how errors name the backend (``"host backend is closed"``);
    * ``OPTIONS``: what ``kvtier_options`` answers.
    """

    name: ClassVar[str] = "backend"
    OPTIONS: ClassVar[Mapping[str, Option]] = {}

    def __init__(self) -> None:
        # No I/O here: kvtier also makes instances only to read their options.
        self._state = _NEW
        self._state_lock = threading.Lock()
        self.namespace = ""

    # what a subclass writes ---------------------------------------------------
    def _open(self, options: Mapping[str, Any], namespace: str) -> None:
        """Connect, create, rebuild: ``kvtier_open`` without the lifecycle."""

    def _close(self) -> None:
        """Release what ``_open`` took; called once, and only if it succeeded."""

    def _capabilities(self) -> Capabilities:
        """What the instance declares; before open, for the default options."""
        return Capabilities()

    def _stats(self) -> Mapping[str, int | float] | None:
        return None

    def _put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> Sequence[bool]:
        raise NotImplementedError

    def _get(self, keys: Sequence[bytes]) -> Sequence[BytesLike | None]:
        raise NotImplementedError

    def _lookup(self, keys: Sequence[bytes]) -> Sequence[bool]:
        raise NotImplementedError

    def _evict(self, keys: Sequence[bytes]) -> Sequence[bool]:
        raise NotImplementedError

    # the state ---------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self._state == _OPEN

    def closed_error(self) -> ClosedError:
        """The error for a call on an instance that is not open, in one wording."""
        state = "closed" if self._state == _CLOSED else "not open"
        return ClosedError(f"{self.name} backend is {state}")

    def ensure_open(self) -> None:
        if self._state != _OPEN:
            raise self.closed_error()

    # lifecycle hooks -------------------------------------------------------------
    @hookimpl
    def kvtier_options(self) -> dict[str, Option]:
        return dict(self.OPTIONS)  # pure introspection: fine before open and after close

    @hookimpl
    def kvtier_open(self, options: Mapping[str, Any], namespace: str) -> None:
        with self._state_lock:
            if self._state == _CLOSED:
                raise self.closed_error()
            if self._state == _OPEN:
                raise KvtierError(f"{self.name} backend is already open")
            self._open(options, namespace)
            self.namespace = namespace
            self._state = _OPEN

    @hookimpl
    def kvtier_capabilities(self) -> Capabilities:
        if self._state == _CLOSED:
            raise self.closed_error()
        return self._capabilities()

    @hookimpl
    def kvtier_stats(self) -> Mapping[str, int | float] | None:
        self.ensure_open()
        return self._stats()

    @hookimpl
    def kvtier_close(self) -> None:
        with self._state_lock:
            was_open = self._state == _OPEN
            self._state = _CLOSED
            if was_open:
                self._close()

    # data hooks ------------------------------------------------------------------
    @hookimpl
    def kvtier_put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> Sequence[bool]:
        self.ensure_open()
        check_batch(keys, blocks)
        if not keys:
            return []
        return first_occurrences(self._put, keys, blocks, evicted)

    @hookimpl
    def kvtier_get(self, keys: Sequence[bytes]) -> Sequence[BytesLike | None]:
        self.ensure_open()
        return self._get(keys) if keys else []

    @hookimpl
    def kvtier_lookup(self, keys: Sequence[bytes]) -> Sequence[bool]:
        self.ensure_open()
        return self._lookup(keys) if keys else []

    @hookimpl
    def kvtier_evict(self, keys: Sequence[bytes]) -> Sequence[bool]:
        self.ensure_open()
        return self._evict(keys) if keys else []


def first_occurrences(
    store: Callable[[Sequence[bytes], Sequence[Any], Evicted], Sequence[bool]],
    keys: Sequence[bytes],
    items: Sequence[Any],
    evicted: Evicted,
) -> list[bool]:
    """``store(keys, items, evicted)`` with each repeated key's first item only.

    Every occurrence of a key answers what its first did: the block is
    stored once, with the bytes the spec says win.
    """
    if len(set(keys)) == len(keys):  # the usual batch: one C-speed test
        return list(store(keys, items, evicted))
    first = first_positions(keys)
    answers = store(list(first), [items[i] for i in first.values()], evicted)
    by_key = dict(zip(first, answers, strict=True))
    return [by_key[key] for key in keys]


class PutParts(BlockStore):
    """Mixin: ``kvtier_put_parts``, the gather write; write ``_put_parts``."""

    def _put_parts(
        self, keys: Sequence[bytes], parts: Sequence[Sequence[BytesLike]], evicted: Evicted
    ) -> Sequence[bool]:
        raise NotImplementedError

    @hookimpl
    def kvtier_put_parts(
        self, keys: Sequence[bytes], parts: Sequence[Sequence[BytesLike]], evicted: Evicted
    ) -> Sequence[bool]:
        self.ensure_open()
        check_batch(keys, parts, "gather lists")
        if not keys:
            return []
        return first_occurrences(self._put_parts, keys, parts, evicted)


class GetInto(BlockStore):
    """Mixin: ``kvtier_get_into``, the scatter read; write ``_get_into``."""

    def _get_into(
        self, keys: Sequence[bytes], buffers: Sequence[Sequence[memoryview]]
    ) -> Sequence[int | None]:
        raise NotImplementedError

    @hookimpl
    def kvtier_get_into(
        self, keys: Sequence[bytes], buffers: Sequence[Sequence[memoryview]]
    ) -> Sequence[int | None]:
        self.ensure_open()
        check_batch(keys, buffers, "scatter lists")
        return self._get_into(keys, buffers) if keys else []


class Scan(BlockStore):
    """Mixin: ``kvtier_scan``, for operators' commands; write ``_scan``."""

    def _scan(self, namespace: str | None) -> Iterator[Sequence[ScanEntry]]:
        raise NotImplementedError

    @hookimpl
    def kvtier_scan(self, namespace: str | None) -> Iterator[Sequence[ScanEntry]]:
        self.ensure_open()  # raised by the call, not at the first batch
        return self._scan(namespace)


class Keep(BlockStore):
    """Mixin: ``kvtier_keep``, retention marks (contract 1.2); write ``_keep``."""

    def _keep(self, keys: Sequence[bytes], keep: bool) -> Sequence[bool | None]:
        raise NotImplementedError

    @hookimpl
    def kvtier_keep(self, keys: Sequence[bytes], keep: bool) -> Sequence[bool | None]:
        self.ensure_open()
        return self._keep(keys, keep) if keys else []


class Expire(BlockStore):
    """Mixin: ``kvtier_expire``, a deadline per block (contract 1.3); write ``_expire``."""

    def _expire(self, keys: Sequence[bytes], after: float) -> Sequence[bool | None]:
        raise NotImplementedError

    @hookimpl
    def kvtier_expire(self, keys: Sequence[bytes], after: float) -> Sequence[bool | None]:
        self.ensure_open()
        return self._expire(keys, after) if keys else []


class Deadlines(BlockStore):
    """Mixin: ``kvtier_deadlines``, the deadlines left (contract 1.4); write ``_deadlines``."""

    def _deadlines(self, keys: Sequence[bytes]) -> Sequence[float | None]:
        raise NotImplementedError

    @hookimpl
    def kvtier_deadlines(self, keys: Sequence[bytes]) -> Sequence[float | None]:
        self.ensure_open()
        return self._deadlines(keys) if keys else []
