"""The host stores that tier instances of one process share, by group.

The tenants of one process share one host capacity (docs/tenants.md): the
instances that name one group share one :class:`~.store.HostStore`.  The
chains of one :class:`~kvtier.chain.tenants.Tenants` name one group (the
internal ``share`` option); without it, host tiers whose ``tenants`` are set
name the group of their settings, so chains opened with the same
configuration share too.  A store is made by the first instance of its group
and released when the last one closes.  Instances naming one group with other
settings (another capacity, other quotas) are refused, as processes opening
one fs root with another capacity are.
"""

from __future__ import annotations

import threading

from kvtier.spec import ConfigError

from .store import HostStore, Settings

__all__ = ["acquire", "release"]

_lock = threading.Lock()
_stores: dict[str, HostStore] = {}
_users: dict[str, int] = {}


def group_of(share: str | None, settings: Settings) -> str | None:
    """The group an instance joins: ``share``, that of its settings where it has tenants
    rules, else none (a store of its own)."""
    if share:
        return f"share:{share}"
    return f"settings:{settings.describe()}" if settings.rules else None


def acquire(group: str, settings: Settings, prefix: bytes, tenant: str) -> HostStore:
    """The store of ``group`` (made now if none is open), with this instance attached."""
    with _lock:
        store = _stores.get(group)
        if store is None:
            store = _stores[group] = HostStore(settings, shared=True, tenant=tenant)
            _users[group] = 0
        elif store.settings != settings:
            raise ConfigError(
                f"host tiers sharing one capacity ({group.split(':', 1)[0]} group) must agree "
                f"on their settings: open with {store.settings.describe()}, asked for "
                f"{settings.describe()}")
        _users[group] += 1
    store.attach(prefix, tenant)
    return store


def release(group: str, store: HostStore, prefix: bytes) -> None:
    """An instance of ``group`` closed: the store goes with its last instance."""
    store.detach(prefix)
    with _lock:
        _users[group] -= 1
        if _users[group] == 0 and _stores.get(group) is store:
            del _stores[group], _users[group]
