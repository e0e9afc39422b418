"""Tenants under LMCache: the tenant of each object key, handed to the tiers on its own.

LMCache 0.5 puts a ``cache_salt`` in every ``ObjectKey``, and kvtier's key of
it (:func:`.keys.kvtier_key`) holds the salt too; but a long key is digested,
so the tiers could not tell whose a block is from its key.  With the adapter's
``tenants`` set, each key's tenant is decided here and the key goes to that
tenant's chain, in its own namespace (:class:`kvtier.chain.tenants.Tenants`):

``tenants: salt``
    Each non-empty salt is a tenant of its own: the salt itself where it is
    a tenant name, else ``salt-`` and 16 hex digits of its digest.
``tenants: {salt: tenant, ...}``
    The salts named are those tenants' (several salts may be one tenant's).

A key whose salt is named (or, with ``salt``, any salted key) is stored in its
tenant's namespace *without* the salt: the namespace already says whose it
is.  Other keys (no salt, or a salt the mapping leaves out) stay the adapter's
own tenant's, with their salt, as without tenants.

**A shared tenant.**  LMCache's chunk hash leaves the salt out, so one prompt
has the same chunk hashes under every salt.  Tenants in ``shared_tenants``
map to the default tenant's namespace, and every tenant's reads (lookups and
loads) that miss its own blocks are tried there, under the same salt-free
key: a system prompt stored once, by a shared tenant's request or by a
request without a salt, is read by every tenant, while what each tenant
stores stays its own, and no tenant removes a shared block (LMCache's
deletes go to the tenant's own namespace).  Without ``shared_tenants`` no
read leaves the tenant's namespace.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from kvtier import Namespace
from kvtier.chain.tenant_router import TenantRouter, qualify, unqualify
from kvtier.chain.tenants import open_tenants

from .keys import ObjectKeyLike, kvtier_key
from .settings import AdapterSettings

__all__ = ["LMCacheTenancy", "salt_tenant", "tenant_of_salt"]

_DEFAULT = Namespace("-").tenant


def tenant_of_salt(salt: str) -> str:
    """The tenant of a salt under ``tenants: salt``: the salt, or a name from its digest."""
    try:
        return Namespace("-", tenant=salt).tenant
    except ValueError:
        return "salt-" + hashlib.blake2b(salt.encode(), digest_size=8).hexdigest()


def salt_tenant(tenants: str | Mapping[str, str] | None, shared: frozenset[str],
                salt: str) -> str | None:
    """The tenant whose namespace holds the keys of ``salt`` under the adapter's
    ``tenants`` and ``shared_tenants`` (a shared one's: the default tenant's), or None
    where ``salt`` names none (its keys are the adapter's own tenant's)."""
    if tenants is None or not salt:
        return None
    if tenants == "salt":
        tenant = tenant_of_salt(salt)
    elif isinstance(tenants, Mapping) and salt in tenants:
        tenant = tenants[salt]
    else:
        return None
    return _DEFAULT if tenant in shared else tenant


class LMCacheTenancy:
    """The adapter's chains and keys: one chain without tenants, a router to theirs with.

    ``chain`` is the adapter's own tenant's (its tiers, stats and load policy
    stand for all: every tenant's chain has the same configuration); ``io``
    takes the keys :meth:`key` makes.
    """

    def __init__(self, settings: AdapterSettings) -> None:
        namespace = Namespace.of(settings.namespace)
        self.own = namespace.tenant
        self._by_salt = settings.tenants
        self._shared = settings.shared_tenants
        self._tenants = open_tenants(settings.chain, namespace, shared=self._shared,
                                     job_workers=settings.job_workers)
        self.chain = self._tenants.chain(self.own)
        fallback = self._fallback if self._shared else None
        self.io: Any = (self.chain if self._by_salt is None
                        else TenantRouter(self._tenants.chain, fallback=fallback))

    def tenant(self, salt: str) -> str | None:
        """The tenant named by ``salt`` (its namespace's), or None where none is named."""
        return salt_tenant(self._by_salt, self._shared, salt)

    def tenant_of(self, salt: str) -> str:
        """The tenant whose chain holds the keys of ``salt``."""
        return self.tenant(salt) or self.own

    def resolve(self, tenant: str) -> str:
        """The tenant whose namespace ``tenant``'s blocks are in (a shared one's: the
        default tenant's)."""
        return _DEFAULT if tenant in self._shared else tenant

    def keep(self, keys: Sequence[ObjectKeyLike]) -> int:
        """Mark LMCache's ``keys`` kept in their tenants' chains: how many were kept."""
        by_tenant: dict[str, list[bytes]] = {}
        for key in keys:
            tenant = self.tenant(key.cache_salt)
            raw = kvtier_key(key) if tenant is None else kvtier_key(key, salt="")
            by_tenant.setdefault(tenant or self.own, []).append(raw)
        return sum(sum(self.chain_of(t).keep(raw)) for t, raw in by_tenant.items())

    def key(self, key: ObjectKeyLike) -> bytes:
        """What the adapter's chain (or router) takes for LMCache's ``key``."""
        if self._by_salt is None:
            return kvtier_key(key)
        tenant = self.tenant(key.cache_salt)
        if tenant is None:
            return qualify(self.own, kvtier_key(key))
        return qualify(tenant, kvtier_key(key, salt=""))

    def _fallback(self, qualified: bytes) -> bytes | None:
        tenant, raw = unqualify(qualified)
        return None if tenant == _DEFAULT else qualify(_DEFAULT, raw)

    def opened(self) -> list[str]:
        """The tenants whose chains are open."""
        return self._tenants.opened()

    def chain_of(self, tenant: str) -> Any:
        """``tenant``'s chain, opened if it is not."""
        return self._tenants.chain(tenant)

    def close(self) -> None:
        """Close every tenant's chain."""
        self._tenants.close()
