"""What bounds an ``fs`` tier's bytes: one interface, :class:`Capacity`, the only one the
backend (:class:`kvtier.backends.fs.FsBackend`) calls, with two implementations.

- :class:`ProcessCapacity`: this process's own count (:class:`~.capacity.Ledger`,
  which the backend keeps under its lock and consults for every put): a remote
  root, a root with ``pool: false`` or on a network filesystem, a root opened to
  be read, or one without ``capacity`` and ``min_free``.
- :class:`~.pool_capacity.PoolCapacity`: the shared pool of a local root
  (:mod:`.pool`), one capacity for every process on it; the ledger then only
  answers lookups.

:func:`~.pool_capacity.open_capacity` picks one at open.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from .capacity import Ledger
from .layout import Store

__all__ = ["Capacity", "Drop", "ProcessCapacity"]

#: Deletes the victims ``(namespace, key)`` the pool chose; answers, per victim, whether
#: its file is gone.
Drop = Callable[[list[tuple[str, bytes]]], list[bool]]


class Capacity(Protocol):
    """The bound on an ``fs`` tier's bytes, as the backend sees it."""

    #: The capacity declared (``Capabilities.capacity``, sizing); None: unbounded.
    limit: int | None
    #: What it bounds: ``process`` (this process's blocks), ``namespace`` or ``pool``
    #: (every process's, of the namespace or of the root).
    scope: str
    #: True: counted for every process together; a put takes room from it first
    #: (:meth:`reserve`) instead of from the ledger, which then only answers lookups.
    shared: bool

    def adopt(self, found: Mapping[bytes, int], ledger: Ledger) -> None:
        """At open: count the blocks ``found`` on disk, and give the ledger its bound."""
        ...

    def reserve(self, keys: Sequence[bytes], sizes: Sequence[int], drop: Drop) -> list[str]:
        """Room for ``keys``: per block ``new`` (write it), ``have`` (being written here),
        ``no`` (refused) or ``pushed`` (stored and evicted at once)."""
        ...

    def landed(self, key: bytes, size: int | None) -> None:
        """The write of ``key`` that :meth:`reserve` granted landed (``size``) or failed."""
        ...

    def used(self, keys: Sequence[bytes]) -> None:
        """A get, or a put of a stored key: a use, in the eviction order."""
        ...

    def forget(self, keys: Sequence[bytes]) -> None:
        """``keys`` are about to be deleted by an explicit evict."""
        ...

    def remove(self, key: bytes) -> bool:
        """Delete ``key``'s file for an explicit evict (after :meth:`forget`)."""
        ...

    def remove_victim(self, victim: tuple[str, bytes]) -> bool:
        """Delete a victim :meth:`reserve` chose, of any namespace of the root."""
        ...

    def snapshot_at_close(self) -> bool:
        """Whether this process writes the namespace's ``index.kvi`` at close."""
        ...

    def stats(self) -> dict[str, int]:
        """Figures that replace or complete the ledger's in ``stats()``."""
        ...

    def close(self) -> None:
        ...


class ProcessCapacity:
    """This process's own count: the ledger bounds its blocks by ``limit``; nothing
    beyond it to reserve, record or report.

    An instance holds one tenant's namespace, so ``limit`` is the least of
    ``capacity`` and that tenant's quota (:func:`~.pool_capacity.open_capacity`).
    Fair share between tenants needs them counted together: only the shared pool
    of a local root does that (docs/tenants.md)."""

    scope = "process"
    shared = False

    def __init__(self, store: Store, limit: int | None) -> None:
        self.store, self.limit = store, limit

    def adopt(self, found: Mapping[bytes, int], ledger: Ledger) -> None:
        ledger.capacity = self.limit

    def reserve(self, keys: Sequence[bytes], sizes: Sequence[int], drop: Drop) -> list[str]:
        return ["new"] * len(keys)  # the ledger made the room (Ledger.plan)

    def landed(self, key: bytes, size: int | None) -> None:
        pass

    def used(self, keys: Sequence[bytes]) -> None:
        pass  # the ledger's order (Ledger.touch)

    def forget(self, keys: Sequence[bytes]) -> None:
        pass

    def remove(self, key: bytes) -> bool:
        return self.store.remove(key)

    def remove_victim(self, victim: tuple[str, bytes]) -> bool:
        return self.store.remove(victim[1])

    def snapshot_at_close(self) -> bool:
        return True

    def stats(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass
