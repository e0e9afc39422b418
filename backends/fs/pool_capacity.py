"""The shared pool as an ``fs`` tier's :class:`~.room.Capacity` (:class:`PoolCapacity`), and
the choice, at open, between it and this process's own count (:func:`open_capacity`).

:class:`PoolCapacity` hands the backend's calls to the pool (:class:`~.pool.SharedPool`)
and does the file work the pool asks of the store: deleting its victims, of any
namespace of the root, and counting again a file an explicit evict could not delete.

:class:`KeepMarks` is the backend's ``kvtier_keep``: under the pool, a mark is a row
of the index's ``kept`` table (:mod:`.pool_keep`), seen by every process on the
root, so no process evicts a kept block and the tenant's ``keep`` budget holds for
all of them together.  Without the pool (a remote root, ``capacity_scope:
process``, a network filesystem, no ``capacity`` nor ``min_free`` nor quota) the
tier keeps no marks: a held block is refused (False) where this process's count
may evict it, and True where nothing bounds the tier, so nothing evicts it
(docs/tenants.md, "Keep").

A tier opened ``read_only`` (``kvtier inspect``) gets no pool, but where the root
has one with ``tenants``, a :class:`~.pool_view.PoolView`: its own count, and the
pool's per-tenant figures read from the index without writing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from kvtier.block.namespace import DEFAULT_TENANT
from kvtier.policies.tenancy import parse_tenants
from kvtier.spec.base import Keep

from .capacity import Ledger
from .layout import Store
from .local import LocalStore
from .mounts import network_fs
from .pool import SharedPool
from .pool_options import DB_NAME
from .pool_tenants import PoolTenants
from .pool_view import PoolView
from .readonly import ReadOnlyStore
from .room import Capacity, Drop, ProcessCapacity

log = logging.getLogger("kvtier.backends.fs")

__all__ = ["KeepMarks", "PoolCapacity", "open_capacity"]


def open_capacity(store: Store, options: Mapping[str, Any], namespace: str) -> Capacity:
    """The shared pool when ``options`` ask for one (``capacity``, ``min_free`` or a quota in
    ``tenants`` on a local root, ``pool`` on) and the root's filesystem allows it; else this
    process's count, bounded by min(``capacity``, the tenant's quota): each instance is
    one tenant's, and tenants share by weight only in the pool (docs/tenants.md)."""
    rules = parse_tenants(options.get("tenants"))
    tenant = options.get("tenant") or DEFAULT_TENANT
    quota = rules.quota(tenant)
    bound = min((b for b in (options["capacity"], quota) if b is not None), default=None)
    # any quota: every tenant's instance joins the pool, so that every tenant is counted
    wanted = (options["capacity"] is not None or options.get("min_free") is not None
              or any(rule.quota is not None for rule in rules.named.values()))
    pooled = options.get("capacity_scope") != "process"  # capacity_scope: process, no pool
    if (isinstance(store, ReadOnlyStore) and isinstance(store.inner, LocalStore) and pooled
            and rules and os.path.exists(os.path.join(store.root, DB_NAME))):
        return PoolView(store, bound, store.root, rules)  # a look at the tenants' figures
    if not (isinstance(store, LocalStore) and pooled and wanted):
        return ProcessCapacity(store, bound)
    root = os.path.dirname(store.nsroot)
    kind = network_fs(root)
    if kind is not None:
        log.warning("fs tier %s: a %s mount: capacity and min_free hold per process only "
                    "(SQLite's locks are unsafe there)", root, kind)
        return ProcessCapacity(store, bound)
    os.makedirs(store.nsroot, exist_ok=True)
    pool = SharedPool(root, namespace, options["capacity"], options["capacity_scope"],
                      options["min_free"], options["pool_lease"],
                      options.get("eviction", "lru"), PoolTenants(rules, tenant))
    return PoolCapacity(store, pool, options["capacity_scope"])


class PoolCapacity:
    """One capacity for every process on a local root (:mod:`.pool`)."""

    shared = True

    def __init__(self, store: LocalStore, pool: SharedPool, scope: str) -> None:
        self.store, self.pool, self.scope = store, pool, scope
        self.limit = pool.capacity
        store.victims_truncated = True  # remove_victim truncates: reads check (LocalStore)

    def adopt(self, found: Mapping[bytes, int], ledger: Ledger) -> None:
        self.pool.adopt(found, self.store)
        # the pool's, for every process together; the ledger only answers lookups, and
        # keeps at most the capacity's worth of them
        ledger.capacity, ledger.bound = None, self.pool.capacity

    def reserve(self, keys: Sequence[bytes], sizes: Sequence[int], drop: Drop) -> list[str]:
        return self.pool.reserve(keys, sizes, drop)

    def landed(self, key: bytes, size: int | None) -> None:
        self.pool.settle(key, size)

    def used(self, keys: Sequence[bytes]) -> None:
        self.pool.touch(keys)  # a use, whichever process wrote them

    def forget(self, keys: Sequence[bytes]) -> None:
        self.pool.forget(keys)

    def remove(self, key: bytes) -> bool:
        """An explicit evict's deletion, whose row went first (:meth:`forget`): a file that
        a fault of its own keeps (``EPERM``, ``EIO``) is counted again, else it stayed on
        the disk uncounted until the next open."""
        try:
            return self.store.remove(key)
        except OSError:
            with contextlib.suppress(OSError):  # the deletion's fault is the one to raise
                size = self.store.size(key)
                if size is not None:
                    self.pool.count_again(key, size)
            raise

    def remove_victim(self, victim: tuple[str, bytes]) -> bool:
        """Delete a victim of any namespace of the root: True, its file is gone (also if
        it was already); a fault raises, for the backend's rule on faults.

        Unlinked, then truncated: a file still open, in a read of any process or in a
        program that holds it, would keep its bytes on the disk after its room was
        given to another block.  Unlinked first, so that a read that overlapped the
        truncation finds the file unlinked (:meth:`LocalStore.evicted`) and answers a
        miss."""
        ns, key = victim
        path = self.store.path(key) if ns == self.pool.ns else LocalStore(
            f"{self.pool.root}/{ns}").path(key)
        try:
            fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return True
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)
        return True

    def keep(self, keys: Sequence[bytes], keep: bool) -> list[bool | None]:
        return self.pool.keep(keys, keep)

    def snapshot_at_close(self) -> bool:
        return self.pool.alone()

    def stats(self) -> dict[str, int]:
        return self.pool.stats()

    def close(self) -> None:
        self.pool.close()


class KeepMarks(Keep):
    """Mixin of :class:`~kvtier.backends.fs.FsBackend`: ``kvtier_keep`` (module docstring)."""

    _capacity: Capacity

    def _keep(self, keys: Sequence[bytes], keep: bool) -> list[bool | None]:
        capacity = self._capacity
        if isinstance(capacity, PoolCapacity):
            return capacity.keep(keys, keep)
        unbounded = capacity.limit is None or not keep  # a release of a held block: True
        return [unbounded if held else None for held in self._lookup(keys)]
