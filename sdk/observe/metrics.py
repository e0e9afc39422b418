"""Per-tier figures out of the process: a Prometheus endpoint and a periodic log line.

Both are switched on from the chain's YAML::

    metrics:
      prometheus_port: 9464   # needs `pip install 'kvtier[metrics]'`
      prometheus_host: 0.0.0.0  # default 127.0.0.1: scraped from this host only
      log_interval: 30s

Every open chain with the same address and port is exported by one HTTP
server, labelled by namespace and tier.  The figures are read from :meth:`Chain.stats` at
scrape time, so the data path pays nothing for them.  A tier whose backend
reports online sizing (``sizing_hit_ratio_<m>x``) also has the gauge
``kvtier_tier_sizing_hit_ratio`` with a ``scale`` label (``0.5x``, ``1x``,
``2x``, ``4x``).  A tier on a store that processes share (the ``fs`` pool) exports
its whole store's ``kvtier_tier_used_bytes``, and beside it what this process wrote of
it: ``kvtier_tier_own_used_bytes`` and ``kvtier_tier_own_blocks``.  A pool of
tenants (``open_tenants``) is exported once, per tenant, with a bounded number
of series (:mod:`.tenant_metrics`, docs/tenants.md).
"""

from __future__ import annotations

import logging
import re
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kvtier.config.units import format_size
from kvtier.spec import ConfigError

if TYPE_CHECKING:
    from kvtier.chain.chain import Chain
    from kvtier.config.chain_config import MetricsConfig
    from kvtier.observe.tenant_metrics import TenantsReporter

__all__ = ["MetricsReporter", "export", "read_sizing", "summary_line", "unexport"]

log = logging.getLogger("kvtier.observe.metrics")

#: Counters exported for every tier: (stats key, metric name, help).
COUNTERS = (
    ("hits", "hits", "blocks served by the tier"),
    ("misses", "misses", "blocks asked of the tier and not found"),
    ("bytes_in", "written_bytes", "payload bytes written to the tier"),
    ("bytes_out", "served_bytes", "payload bytes served by the tier"),
    ("errors", "errors", "backend faults"),
    ("failed", "failed_blocks", "blocks of stores that raised or met the write back-off"),
    ("corrupt", "corrupt_blocks", "blocks rejected by a format or checksum check"),
    ("size_mismatch", "size_mismatches",
     "sound blocks of another size than the reader's buffer (a miss, the block kept)"),
    ("evictions", "evictions", "blocks pushed out by capacity"),
    ("demoted", "demoted_blocks", "blocks written on eviction from the tier above"),
    ("promoted", "promoted_blocks", "blocks copied up from a tier below"),
    ("dropped", "dropped_writes", "asynchronous writes abandoned while unhealthy"),
    ("not_admitted", "not_admitted_blocks",
     "blocks not written: their keys seen fewer times than admit, their lineage not sampled"),
    ("sample_admitted", "sample_admitted_blocks",
     "blocks written at first sight, their lineage sampled (admit_sample): seen too few times"),
    ("declined", "declined_blocks", "held blocks not loaded: recomputing them was faster"),
    ("declined_tokens", "declined_tokens", "tokens of the blocks declined as not worth loading"),
    ("probes", "probed_blocks", "blocks read only to measure an unmeasured tier's load cost"),
    ("read_backs", "read_back_blocks",
     "blocks read back after stores to measure an unmeasured tier's load cost"),
    ("read_back_failures", "read_back_failures",
     "read-backs a fault of the tier ended, no sample taken (counted in its errors too)"),
    ("kept_costs", "kept_costs",
     "times the load cost an earlier process kept judged the tier slow, instead of a probe"),
    ("keep_refused", "keep_refused_blocks",
     "keep marks refused: beyond the tenant's retention budget (docs/tenants.md)"),
)

#: Backend stats of a shared store's share written by this process, exported as gauges.
_OWN = (("own_used_bytes", "bytes this process wrote that the tier's shared store holds"),
        ("own_blocks", "blocks this process wrote that the tier's shared store holds"))

#: Backend stats of online sizing, one per scale: ``sizing_hit_ratio_0.5x`` ...
_SIZING = "sizing_hit_ratio_"

_exporters: dict[tuple[str, int], _Exporter] = {}  # by address and port
_exporters_lock = threading.Lock()


class _Exporter:
    """One HTTP server per port, collecting from every chain registered on it."""

    def __init__(self, host: str, port: int) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError as exc:
            raise ConfigError(
                "needs prometheus-client: pip install 'kvtier[metrics]'",
                key="metrics.prometheus_port",
            ) from exc
        self.chains: weakref.WeakSet[Chain] = weakref.WeakSet()
        #: Pools of tenants (:mod:`.tenant_metrics`): their top tenants' chains, and
        #: their per-tenant families.
        self.sources: weakref.WeakSet[TenantsReporter] = weakref.WeakSet()
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["namespace", "tier", "backend"]
        families = {
            key: CounterMetricFamily(f"kvtier_tier_{name}", text, labels=labels)
            for key, name, text in COUNTERS
        }
        healthy = GaugeMetricFamily(
            "kvtier_tier_healthy", "1 if the tier is in service", labels=labels
        )
        used = GaugeMetricFamily("kvtier_tier_used_bytes", "bytes held by the tier", labels=labels)
        # a store shared by processes (the fs pool): used_bytes is the whole store's,
        # these what this process wrote of it
        own = {key: GaugeMetricFamily(f"kvtier_tier_{key}", text, labels=labels)
               for key, text in _OWN}
        block_load = GaugeMetricFamily(
            "kvtier_tier_block_load_seconds",
            "expected time to load a usual block of the tier (0.9 quantile; 0 until measured)",
            labels=labels,
        )
        load_samples = GaugeMetricFamily(  # what that load time came from
            "kvtier_tier_load_samples", "reads the tier's load cost holds (measured tiers), "
            "by what measured it last: load, probe, read-back, or kept ...",
            labels=[*labels, "source"])
        latency = GaugeMetricFamily(
            "kvtier_tier_latency_seconds",
            "batch latency quantiles",
            labels=[*labels, "op", "quantile"],
        )
        sizing = GaugeMetricFamily(
            "kvtier_tier_sizing_hit_ratio",
            "estimated hit ratio of gets at a scale of the tier's capacity (online sizing)",
            labels=[*labels, "scale"],
        )
        # what loads are weighed against: the recompute model, and where it came from
        recompute = GaugeMetricFamily(
            "kvtier_recompute_seconds_per_token",
            "the recompute model's time a token (0 without one), by source: configured, "
            "learned or none", labels=["namespace", "source"])
        samples = GaugeMetricFamily(
            "kvtier_recompute_samples", "timed recomputes the learned model holds",
            labels=["namespace", "source"])
        every = [chain.stats() for chain in list(self.chains)]
        per_tenant: list[Any] = []
        for source in list(self.sources):
            top_chains, families_of_tenants = source.collect()
            every += top_chains
            per_tenant += families_of_tenants
        for stats in every:
            model = stats["recompute"]
            recompute.add_metric([stats["namespace"], model["source"]], model["per_token_s"])
            samples.add_metric([stats["namespace"], model["source"]], model["samples"])
            for tier in stats["tiers"]:
                values = [stats["namespace"], tier["name"], tier["backend"]]
                for key, family in families.items():
                    family.add_metric(values, tier[key])
                healthy.add_metric(values, 1.0 if tier["healthy"] else 0.0)
                block_load.add_metric(values, tier["load_cost"]["block_s"])
                if tier["load_cost"]["measured"]:
                    load_samples.add_metric([*values, tier["load_cost"]["source"]],
                                            tier["load_cost"]["samples"])
                used_bytes = tier["backend_stats"].get("used_bytes")
                if isinstance(used_bytes, (int, float)):
                    used.add_metric(values, used_bytes)
                for key, gauge in own.items():
                    if isinstance(mine := tier["backend_stats"].get(key), (int, float)):
                        gauge.add_metric(values, mine)
                for op, summary in tier["latency"].items():
                    for q in ("p50", "p99"):
                        latency.add_metric([*values, op, q], summary[f"{q}_s"])
                for key, value in tier["backend_stats"].items():
                    if key.startswith(_SIZING):
                        sizing.add_metric([*values, key[len(_SIZING):]], value)
        yield from families.values()
        yield from (healthy, used, *own.values(), latency, block_load, load_samples, sizing,
                    recompute, samples)
        yield from per_tenant


def export(where: tuple[str, int], source: TenantsReporter) -> None:
    """Export ``source`` on the endpoint at ``where`` (address, port), started if need be."""
    with _exporters_lock:
        exporter = _exporters.get(where)
        if exporter is None:
            exporter = _exporters[where] = _Exporter(*where)
        exporter.sources.add(source)


def unexport(where: tuple[str, int], source: TenantsReporter) -> None:
    """Stop exporting ``source``; its series are gone from the next scrape."""
    with _exporters_lock:
        exporter = _exporters.get(where)
        if exporter is not None:
            exporter.sources.discard(source)


_SIZING_LINE = re.compile(r'^kvtier_tier_sizing_hit_ratio\{(.*)\} (\S+)$', re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def read_sizing(exposition: str) -> dict[tuple[str, str], dict[str, float]]:
    """Online sizing out of a Prometheus exposition this module wrote: the estimate at
    each scale (``0.5x`` ...) per ``(tier, namespace)``."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    for labels, value in _SIZING_LINE.findall(exposition):
        named = dict(_LABEL.findall(labels))
        if {"tier", "namespace", "scale"} <= named.keys():
            found.setdefault((named["tier"], named["namespace"]), {})[named["scale"]] = (
                float(value))
    return found


def summary_line(stats: dict[str, Any]) -> str:
    """One log line for a chain: hits/misses and bytes per tier."""
    parts = []
    for tier in stats["tiers"]:
        part = (
            f"{tier['name']}: {tier['hits']} hit {tier['misses']} miss "
            f"{format_size(tier['bytes_out'])} out {format_size(tier['bytes_in'])} in"
        )
        if tier["corrupt"] or tier["errors"]:
            part += f" {tier['corrupt']} corrupt {tier['errors']} errors"
        if not tier["healthy"]:
            part += " UNHEALTHY"
        parts.append(part)
    return f"kvtier [{stats['namespace'][:8]}] " + " | ".join(parts)


class MetricsReporter:
    """What a chain switches on from its ``metrics`` section; stopped by ``Chain.close``."""

    def __init__(self, chain: Chain, config: MetricsConfig) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        port = config.prometheus_port
        self._where = None if port is None else (config.prometheus_host, port)
        if self._where is not None:
            with _exporters_lock:
                exporter = _exporters.get(self._where)
                if exporter is None:
                    exporter = _exporters[self._where] = _Exporter(*self._where)
                exporter.chains.add(chain)
        if config.log_interval:
            chain_ref = weakref.ref(chain)
            interval = config.log_interval

            def run() -> None:
                while not self._stop.wait(interval):
                    target = chain_ref()
                    if target is None:
                        return
                    log.info("%s", summary_line(target.stats()))

            self._thread = threading.Thread(target=run, name="kvtier-stats-log", daemon=True)
            self._thread.start()

    def stop(self, chain: Chain) -> None:
        self._stop.set()
        if self._where is not None:
            with _exporters_lock:
                exporter = _exporters.get(self._where)
                if exporter is not None:
                    exporter.chains.discard(chain)
