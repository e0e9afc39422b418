"""Whose request it is: the tenant of each vLLM request, and its chain.

vLLM hands a tier every request's ``ReqContext``, with the request's
``kv_transfer_params`` (from its sampling parameters, so an HTTP client of
``vllm serve`` sets them).  The tenant is read from
``kv_transfer_params["kvtier"]["tenant"]``; a request that names none is the
tier's ``tenant`` (``default`` unless configured).  With
``trust_client_tenant: false`` the tier ignores what requests name and every
request is the configured ``tenant``: the setting for an engine that clients
reach without a trusted gateway setting or stripping that field (SECURITY.md,
"a client that spoofs a tenant").

A name that is not a tenant name (:func:`kvtier.block.namespace.check_tenant`)
is refused: the request's lookups are misses and its stores are not made,
with one log line per request; it never raises into vLLM.

Each tenant's blocks go to that tenant's chain (:class:`kvtier.chain.tenants.Tenants`),
in its own namespace; the tier's verdicts and jobs are keyed by
tenant-qualified keys (:mod:`kvtier.chain.tenant_router`), so a verdict of
one tenant never answers another.  vLLM's own CPU tier (its ``CachePolicy``)
is told of no request, so it is not per tenant: per-tenant salts keep
tenants apart there (docs/tenants.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvtier.block.namespace import DEFAULT_TENANT, Namespace, check_tenant
from kvtier.chain import Chain
from kvtier.chain.tenant_router import TenantRouter, qualify
from kvtier.chain.tenants import Tenants
from kvtier.config import ChainConfig

from .keys import chain_key
from .tier_metrics import AdapterCounters

__all__ = ["RequestTenant", "TenantRouting", "qualified_key"]

log = logging.getLogger("kvtier.vllm")


@dataclass(frozen=True)
class RequestTenant:
    """A request's tenant, kept in its ``ReqContext`` state; ``name`` None: refused."""

    name: str | None


class TenantRouting:
    """The tenants of one vLLM tier: each request's tenant, and a router to their chains.

    The configured ``tenant``'s chain is the tier's own (:meth:`open_own`,
    served as ``default_chain()``, which the tier may reopen); the others
    open on their first request, over the same configuration.  :meth:`close`
    closes them all.
    """

    def __init__(
        self,
        config: ChainConfig,
        namespace: Namespace,
        default_chain: Callable[[], Any],
        *,
        trust_client_tenant: bool,
        shared: frozenset[str],
        job_workers: int,
        retry_after: float,
        on_open: Callable[[Any], None],
    ) -> None:
        self.tenant = namespace.tenant
        self.trust_client_tenant = trust_client_tenant
        self.shared = shared
        self._default_chain = default_chain
        self._on_open = on_open
        self._tenants = Tenants(config, namespace, shared=shared, job_workers=job_workers)
        self.router = TenantRouter(self._chain_of, retry_after=retry_after)

    def open_own(self) -> Chain:
        """The configured tenant's chain, opened now, among the other tenants' (an
        in-process tier shares its capacity between them)."""
        chain = self._tenants.chain(self.tenant)
        self._on_open(chain)
        return chain

    def _chain_of(self, tenant: str) -> Any:
        if tenant == self.tenant:
            return self._default_chain()
        opened = set(self._tenants.opened())
        chain = self._tenants.chain(tenant)
        if tenant not in opened:
            log.info("kvtier: tenant %r's chain opened", tenant)
            self._on_open(chain)
        return chain

    def of(self, req_context: Any, counters: AdapterCounters) -> str | None:
        """The tenant of the request (its namespace's: a shared tenant is the default's),
        or None if it named a bad one.  Decided once per request."""
        get_state = getattr(req_context, "get_state", None)
        known = get_state(RequestTenant) if get_state is not None else None
        if isinstance(known, RequestTenant):
            return known.name
        named = _named_tenant(req_context)
        name: str | None = self.tenant
        if named is None:
            counters.count("tenant_requests", "unnamed")
        elif not self.trust_client_tenant:
            counters.count("tenant_requests", "ignored")
        elif not isinstance(named, str) or not _valid(named):
            counters.count("tenant_requests", "refused")
            log.warning("kvtier: request %s names tenant %r, not a tenant name (1 to 64 "
                        "letters, digits, _ . : @ -): refused, its blocks are misses",
                        getattr(req_context, "req_id", "?"), named)
            name = None
        else:
            counters.count("tenant_requests", "named")
            name = DEFAULT_TENANT if named in self.shared else named
        set_state = getattr(req_context, "set_state", None)
        if set_state is not None:
            set_state(RequestTenant(name))
        return name

    def chain_of(self, tenant: str) -> Any:
        """``tenant``'s chain (None while it fails to open)."""
        return self.router.chain(tenant)

    def opened(self) -> list[str]:
        """The tenants whose chains are open, the tier's own first."""
        return [self.tenant, *(t for t in self._tenants.opened() if t != self.tenant)]

    def close(self) -> None:
        """Close every tenant's chain, the tier's own too."""
        self._tenants.close()


def qualified_key(tenant: str, key: bytes) -> bytes:
    """The tier's key for vLLM ``key`` of ``tenant``: the chain key, qualified."""
    return qualify(tenant, chain_key(key))


def _named_tenant(req_context: Any) -> Any:
    params = getattr(req_context, "kv_transfer_params", None)
    ours = params.get("kvtier") if isinstance(params, dict) else None
    return ours.get("tenant") if isinstance(ours, dict) else None


def _valid(name: str) -> bool:
    try:
        check_tenant(name)
    except ValueError:
        return False
    return True
