"""Per-tenant figures on the Prometheus endpoint, with a bounded number of series.

A pool opened with :func:`~kvtier.chain.tenants.open_tenants` and a
``metrics.prometheus_port`` exports, per tier and tenant, the figures of
:mod:`.tenant_figures` (:data:`FAMILIES`), labelled ``namespace`` (the
default tenant's), ``tier`` and ``tenant``::

    metrics:
      prometheus_port: 9464
      tenants_top: 20         # tenants with series of their own
      tenants_interval: 60s   # how often the top is ranked again

A pool may serve thousands of tenants, and every label value is a series
Prometheus keeps.  So only the ``tenants_top`` tenants holding the most bytes
(in all tiers) have series of their own; the rest are summed under the tenant
``other``.  The ranking is computed at the first scrape and again at the first
scrape after each ``tenants_interval``: between rankings a tenant keeps its
place, so a series does not come and go with every put.  A tenant that leaves
the top has its series removed (the collector yields what the ranking names,
nothing else) and its figures counted in ``other`` from then on; one that
enters it leaves ``other``, whose counters then fall, which Prometheus reads
as a counter reset.  A tenant named ``other`` is always counted in ``other``,
so that the label names one thing.  ``kvtier_tenants_in_other`` says how many
tenants ``other`` sums.

The per-tier families (``kvtier_tier_*``, labelled by each chain's
namespace) are exported for the chains of the top tenants only, by the same
rule.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from kvtier.observe.metrics import export, unexport
from kvtier.observe.tenant_figures import FIGURES

if TYPE_CHECKING:
    from kvtier.config.chain_config import MetricsConfig

__all__ = ["FAMILIES", "OTHER", "TenantsReporter", "TopTenants", "fold"]

#: The label value of the tenants beyond the top.
OTHER = "other"
#: The per-tenant families: (figure, metric name, counter or gauge, help).
FAMILIES = (
    ("hits", "kvtier_tenant_hits", "counter", "the tenant's blocks served by the tier"),
    ("misses", "kvtier_tenant_misses", "counter",
     "the tenant's blocks asked of the tier and not found"),
    ("refused", "kvtier_tenant_refused_blocks", "counter",
     "the tenant's blocks the tier refused (no room within its quota, too large)"),
    ("evictions", "kvtier_tenant_evictions", "counter",
     "the tenant's blocks pushed out of the tier by capacity or quota"),
    ("expired", "kvtier_tenant_expired_blocks", "counter", "the tenant's blocks that expired"),
    ("used_bytes", "kvtier_tenant_used_bytes", "gauge", "bytes of the tenant's the tier holds"),
    ("kept_bytes", "kvtier_tenant_kept_bytes", "gauge",
     "bytes of the tenant's blocks the tier keeps marked (within its keep budget)"),
    ("keep_refused", "kvtier_tenant_keep_refused_blocks", "counter",
     "the tenant's keep marks the tier refused (beyond its keep budget)"),
)


class TenantSource(Protocol):
    """What the reporter reads: a pool's per-tenant figures and its tenants' chains' stats."""

    def tenant_snapshot(self) -> tuple[str, dict[str, Any], dict[str, dict[str, Any]]]:
        """``(namespace, figures per tenant, Chain.stats per open tenant)``."""
        ...


class TopTenants:
    """The ``top`` tenants by bytes held, ranked again once ``interval`` seconds have passed."""

    def __init__(self, top: int, interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.top, self.interval, self._clock = top, interval, clock
        self._named: frozenset[str] | None = None
        self._at = 0.0
        self._lock = threading.Lock()

    def named(self, held: Mapping[str, int]) -> frozenset[str]:
        """The tenants with series of their own; ``held`` is every tenant's bytes now,
        read only when the ranking is due."""
        with self._lock:
            now = self._clock()
            if self._named is None or now - self._at >= self.interval:
                ranked = sorted((t for t in held if t != OTHER), key=lambda t: (-held[t], t))
                self._named, self._at = frozenset(ranked[: self.top]), now
            return self._named


def fold(figures: Mapping[str, Mapping[str, Any]], named: Iterable[str]
         ) -> dict[str, dict[str, dict[str, int]]]:
    """Per label value (a named tenant, or :data:`OTHER` for the rest summed), per tier,
    the :data:`~kvtier.observe.tenant_figures.FIGURES`."""
    keep = set(named)
    rows: dict[str, dict[str, dict[str, int]]] = {}
    for tenant, entry in figures.items():
        label = tenant if tenant in keep else OTHER
        for tier, values in entry["tiers"].items():
            into = rows.setdefault(label, {}).setdefault(tier, dict.fromkeys(FIGURES, 0))
            for figure in FIGURES:
                into[figure] += values.get(figure, 0)
    return rows


class TenantsReporter:
    """A pool's per-tenant series on its Prometheus endpoint; stopped by ``Tenants.close``."""

    def __init__(self, source: TenantSource, config: MetricsConfig) -> None:
        assert config.prometheus_port is not None
        self._source = weakref.ref(source)
        self.top = TopTenants(config.tenants_top, config.tenants_interval)
        self._where = (config.prometheus_host, config.prometheus_port)
        export(self._where, self)

    def collect(self) -> tuple[list[dict[str, Any]], list[Any]]:
        """The top tenants' chains' stats, and the per-tenant metric families."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        source = self._source()
        if source is None:
            return [], []
        namespace, figures, chains = source.tenant_snapshot()
        named = self.top.named({t: f["used_bytes"] for t, f in figures.items()})
        labels = ["namespace", "tier", "tenant"]
        families = {
            figure: (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, text, labels=labels)
            for figure, name, kind, text in FAMILIES
        }
        for label, tiers in sorted(fold(figures, named).items()):
            for tier, values in tiers.items():
                for figure, family in families.items():
                    family.add_metric([namespace, tier, label], values[figure])
        folded = GaugeMetricFamily("kvtier_tenants_in_other",
                                   "tenants whose figures the tenant 'other' sums",
                                   labels=["namespace"])
        folded.add_metric([namespace], sum(1 for t in figures if t not in named))
        top_chains = [stats for tenant, stats in chains.items() if tenant in named]
        return top_chains, [*families.values(), folded]

    def stop(self) -> None:
        unexport(self._where, self)
