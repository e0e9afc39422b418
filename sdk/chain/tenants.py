"""Tenants of one tier chain: a chain per tenant, from one configuration.

A tenant is part of a block's namespace (:class:`~kvtier.block.Namespace`),
so each tenant's blocks live in a namespace of their own at every tier, and
a key of one tenant never names a block of another.  :class:`Tenants` opens
the chain of each tenant on its first use and keeps it; every call on that
chain is the tenant's, so the batch API is unchanged (docs/tenants.md)::

    tenants = open_tenants("chain.yaml", {"model": "llama"}, shared={"public"})
    tenants.chain("acme").put(keys, blocks)
    tenants.chain(None).get(keys, out)   # the default tenant
    tenants.close()

Each tenant's chain opens its own backend instances over the same
configuration (the same fs root, the same bucket): what they hold is apart.
The tenants share each tier's capacity under the tier's ``tenants`` rules
(quotas and weights, :mod:`kvtier.policies.tenancy`).  A tier in the process
(``host``) shares one capacity between the chains of one :class:`Tenants`:
each tier whose backend takes the internal ``share`` option is handed one
group, the same for every tenant's chain (docs/tenants.md).

:meth:`Tenants.stats` gives each tenant's figures per tier
(:mod:`kvtier.observe.tenant_figures`).  With ``metrics.prometheus_port``, the
pool is exported once, per tenant, its top tenants by bytes held apart and the
rest as ``other`` (:mod:`kvtier.observe.tenant_metrics`); the tenants' chains
are not exported each on its own, which would give every tenant its series.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
from collections.abc import Collection, Mapping
from typing import Any

from kvtier.block.namespace import Namespace
from kvtier.chain.chain import Chain
from kvtier.config.chain_config import ChainConfig, load_config
from kvtier.observe.tenant_figures import tenant_figures
from kvtier.observe.tenant_metrics import TenantsReporter
from kvtier.plugins.options import with_values
from kvtier.plugins.registry import BackendRegistry
from kvtier.policies.tenant_round import tenant_round
from kvtier.spec import ClosedError

__all__ = ["Tenants", "open_tenants"]

#: Numbers the groups of ``share``: one per :class:`Tenants`, never reused in a process.
_groups = itertools.count(1)


def sharing(config: ChainConfig, group: str) -> ChainConfig:
    """``config`` with ``group`` as the ``share`` of every tier whose backend takes one."""
    tiers = tuple(dataclasses.replace(t, options=with_values(t.options, share=group))
                  if "share" in t.options and not t.options["share"] else t
                  for t in config.tiers)
    return dataclasses.replace(config, tiers=tiers)


class Tenants:
    """The chains of a pool's tenants, opened on first use.  Thread-safe."""

    def __init__(
        self,
        config: ChainConfig,
        namespace: Namespace,
        *,
        shared: Collection[str] = (),
        registry: BackendRegistry | None = None,
        **options: Any,
    ) -> None:
        # every tenant's chain names one group: its in-process tiers share their capacity
        self.config = sharing(config, f"tenants-{os.getpid()}-{next(_groups)}")
        self.namespace = namespace
        #: Tenants declared shared: they map to the default tenant's namespace.
        self.shared = frozenset(shared)
        self._registry, self._options = registry, options
        self._chains: dict[str, Chain] = {}
        self._lock = threading.Lock()
        self._closed = False
        # the pool is exported as one, its tenants' chains not each on its own
        metrics = self.config.metrics
        self._chain_config = dataclasses.replace(
            self.config, metrics=dataclasses.replace(metrics, prometheus_port=None))
        self._reporter = (None if metrics.prometheus_port is None
                          else TenantsReporter(self, metrics))

    def chain(self, tenant: str | None) -> Chain:
        """The chain of ``tenant`` (``None``: the default tenant), opened on first use."""
        namespace = self.namespace.for_tenant(tenant, self.shared)
        with self._lock:
            if self._closed:
                raise ClosedError("tenants are closed")
            chain = self._chains.get(namespace.tenant)
            if chain is None:
                chain = Chain(self._chain_config, namespace, self._registry, **self._options)
                self._chains[namespace.tenant] = chain
            return chain

    def opened(self) -> list[str]:
        """The tenants whose chains are open."""
        with self._lock:
            return sorted(self._chains)

    def stats(self) -> dict[str, Any]:
        """Per tenant, per tier: hits, misses, refused, evictions, expired and used_bytes.

        ``namespace`` is the default tenant's; ``tenants`` holds every tenant
        opened here, and every tenant a tier reports (a shared ``fs`` pool
        reports those of other processes too), by name
        (:func:`~kvtier.observe.tenant_figures.tenant_figures`).
        """
        namespace, figures, _ = self.tenant_snapshot()
        return {"namespace": namespace, "tenants": figures}

    def tenant_snapshot(self) -> tuple[str, dict[str, Any], dict[str, dict[str, Any]]]:
        """``(namespace, figures per tenant, Chain.stats per open tenant)``: what
        :meth:`stats` and the Prometheus endpoint read, the chains' stats read once."""
        with self._lock:
            chains = dict(self._chains)
        with tenant_round():  # a store shared by the tenants reports each tenant once
            opened = {tenant: chain.stats() for tenant, chain in chains.items()}
        figures = tenant_figures(opened, [tier.name for tier in self.config.tiers])
        return self.namespace.for_tenant(None).hex, figures, opened

    def close(self) -> None:
        """Close every tenant's chain.  Idempotent."""
        if self._reporter is not None:
            self._reporter.stop()
        with self._lock:
            self._closed = True
            chains, self._chains = list(self._chains.values()), {}
        for chain in chains:
            chain.close()

    def __enter__(self) -> Tenants:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_tenants(
    config: str | os.PathLike[str] | Mapping[str, Any] | ChainConfig,
    namespace: Namespace | str | Mapping[str, Any],
    *,
    shared: Collection[str] = (),
    registry: BackendRegistry | None = None,
    **options: Any,
) -> Tenants:
    """:class:`Tenants` over the chain ``config`` describes, as :func:`~kvtier.open_chain` takes it.

    ``namespace`` is the model's (its tenant is ignored: each chain has its
    own); ``shared`` names tenants whose blocks are everyone's.
    """
    if not isinstance(config, ChainConfig):
        config = load_config(config, registry=registry)
    return Tenants(config, Namespace.of(namespace), shared=shared, registry=registry, **options)
