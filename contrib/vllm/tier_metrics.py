"""The vLLM tier's metrics: what it declares to vLLM, the adapter's counters, and the deltas.

vLLM's Prometheus logger rejects a metric it was not told about, so every
name and label that :func:`offloading_stats` reports is declared by
:func:`metric_definitions` from the same tables.  Per kvtier tier, the
chain's own counters are reported as the change since the last report; the
adapter's counters (lookups, loads, stores, dropped blocks, KV events) are
kept here.

The load decision's figures go the same way, so that an operator reading
vLLM's ``/metrics`` sees why a tier was declined: per tier the blocks and
tokens declined, the probes, read-backs and their failures, the kept fits
that judged it (counters, as deltas), and the tier's expected load time a
block (a gauge); and what that was weighed against, the recompute model's
time a token, its samples, and its source (gauges).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._compat import (
    OffloadingConnectorStats,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
)

__all__ = ["DECISION_METRICS", "METRIC_PREFIX", "AdapterCounters", "metric_definitions",
           "offloading_stats"]

#: Prefix of the metrics this tier reports through vLLM.
METRIC_PREFIX = "vllm:kv_offload_kvtier_"
_TIER_LABEL = ("kvtier_tier",)
#: Per kvtier tier: (chain stats key, metric suffix, help).
_TIER_COUNTERS = (
    ("hits", "hits", "Blocks served by a kvtier tier."),
    ("misses", "misses", "Blocks asked of a kvtier tier and not found there."),
    ("corrupt", "corrupt_blocks", "Blocks a kvtier tier rejected by a format or checksum check."),
    ("errors", "errors", "Faults of a kvtier tier's backend."),
    ("bytes_out", "served_bytes", "Payload bytes served by a kvtier tier."),
    ("bytes_in", "written_bytes", "Payload bytes written to a kvtier tier."),
    ("evictions", "evictions", "Blocks a kvtier tier dropped for capacity."),
    ("promoted", "promoted_blocks", "Blocks copied up into a kvtier tier from one below."),
    ("dropped", "dropped_writes", "Asynchronous writes a kvtier tier abandoned."),
)
#: Per kvtier tier, the load decision's counters (chain stats key, metric suffix, help): the
#: suffixes are those of kvtier's own Prometheus figures (``kvtier_tier_declined_blocks``...).
_DECISION_COUNTERS = (
    ("declined", "declined_blocks",
     "Blocks a kvtier tier held and the load policy declined: recomputing them was faster."),
    ("declined_tokens", "declined_tokens", "Tokens of the blocks a kvtier tier declined."),
    ("probes", "probed_blocks", "Blocks read from a kvtier tier only to measure its load cost."),
    ("read_backs", "read_back_blocks",
     "Blocks read back from a kvtier tier after stores, to measure its load cost."),
    ("read_back_failures", "read_back_failures",
     "Read-backs of a kvtier tier a fault ended: no sample taken, the tier stays unmeasured."),
    ("kept_costs", "kept_costs",
     "Times the load cost an earlier process kept judged a kvtier tier, instead of a probe."),
)
#: Per kvtier tier, the load decision's gauges: (metric suffix, help).
_DECISION_GAUGES = (
    ("block_load_seconds", "Expected time to load a usual block of a kvtier tier "
     "(0.9 quantile; 0 until measured)."),
    ("load_samples", "Reads a kvtier tier's load-cost fit took in this process (0 unmeasured)."),
)
#: What loads are weighed against: the recompute model, and where it came from.
_RECOMPUTE = "recompute_"
_SOURCES = ("configured", "learned", "none")
#: The load decision's metrics, as vLLM names them (docs/load-policy.md lists them).
DECISION_METRICS = tuple(METRIC_PREFIX + suffix for suffix in (
    *(suffix for _, suffix, _ in _DECISION_COUNTERS), *(suffix for suffix, _ in _DECISION_GAUGES),
    *(_RECOMPUTE + what for what in ("seconds_per_token", "samples", "source"))))
#: Adapter counters: (name, label names, help).
_ADAPTER_COUNTERS = (
    ("lookup_keys", ("result",), "Chunk lookups answered by the kvtier tier: hit, miss, timeout."),
    ("load_keys", ("outcome",), "Chunks the kvtier tier was asked to load: ok, failed."),
    ("store_keys", ("outcome",), "Chunks the kvtier tier was asked to store: ok, failed, skipped."),
    ("dropped_keys", ("reason",), "Blocks removed from the chain after they failed to load."),
    ("kv_events", ("kind",), "Blocks in KV events the kvtier tier gave vLLM: stored, removed."),
    ("tenant_requests", ("how",), "Requests by how their tenant was set: named (by the "
     "client), unnamed, ignored (named, not trusted), refused (not a tenant name)."),
)
_HEALTHY = "tier_healthy"


def metric_definitions() -> dict[str, OffloadingMetricMetadata]:
    """Every metric :func:`offloading_stats` may report, with its help and label names."""
    defs: dict[str, OffloadingMetricMetadata] = {}
    for _, suffix, text in _TIER_COUNTERS:
        defs[METRIC_PREFIX + suffix] = OffloadingCounterMetadata(
            documentation=text, labelnames=_TIER_LABEL
        )
    defs[METRIC_PREFIX + _HEALTHY] = OffloadingGaugeMetadata(
        documentation="1 while a kvtier tier is in service, 0 while it is skipped.",
        labelnames=_TIER_LABEL,
    )
    for name, labels, text in _ADAPTER_COUNTERS:
        defs[METRIC_PREFIX + name] = OffloadingCounterMetadata(
            documentation=text, labelnames=labels
        )
    for _, suffix, text in _DECISION_COUNTERS:
        defs[METRIC_PREFIX + suffix] = OffloadingCounterMetadata(
            documentation=text, labelnames=_TIER_LABEL
        )
    for suffix, text in _DECISION_GAUGES:
        defs[METRIC_PREFIX + suffix] = OffloadingGaugeMetadata(
            documentation=text, labelnames=_TIER_LABEL
        )
    defs[METRIC_PREFIX + _RECOMPUTE + "seconds_per_token"] = OffloadingGaugeMetadata(
        documentation="The recompute model's time a token, that loads are weighed against "
        "(0 without a model)."
    )
    defs[METRIC_PREFIX + _RECOMPUTE + "samples"] = OffloadingGaugeMetadata(
        documentation="Timed recomputes the learned recompute model holds."
    )
    # one series per source, 1 for the model's: a source that changes leaves no stale 1
    defs[METRIC_PREFIX + _RECOMPUTE + "source"] = OffloadingGaugeMetadata(
        documentation="1 for where the recompute model came from (configured, learned, "
        "none), 0 for the others.", labelnames=("source",)
    )
    return defs


class AdapterCounters:
    """The adapter's counters, since the last report and in total; guarded by the tier's lock.

    ``active`` says whether anything happened since the last report: vLLM
    asks for stats every step, and an idle tier answers None without reading
    the chain's figures.
    """

    def __init__(self) -> None:
        self._since: dict[tuple[str, str], int] = {}
        self._totals: dict[tuple[str, str], int] = {}
        self.active = False
        self.last_report = 0.0

    def count(self, name: str, label: str, n: int = 1) -> None:
        key = (name, label)
        self._since[key] = self._since.get(key, 0) + n
        self._totals[key] = self._totals.get(key, 0) + n
        self.active = True

    def take(self, now: float) -> dict[tuple[str, str], int] | None:
        """The counts since the last report, or None if idle and reported within a second."""
        if not self.active and now - self.last_report < 1.0:
            return None
        self.active = False
        self.last_report = now
        since, self._since = self._since, {}
        return since

    def totals(self) -> dict[str, int]:
        """Counts so far, by ``"name:label"``."""
        return {f"{n}:{label}": v for (n, label), v in sorted(self._totals.items())}


def offloading_stats(
    counts: Mapping[tuple[str, str], int],
    chain_stats: Mapping[str, Any],
    reported: dict[str, dict[str, int]],
) -> Any:
    """vLLM offloading stats of the adapter's ``counts`` and what changed in ``chain_stats``.

    ``reported`` holds, per kvtier tier, the chain counters already reported;
    it is brought up to date.  Returns None when there is nothing to report.
    """
    stats = OffloadingConnectorStats()
    for (name, label), value in counts.items():
        stats.increase_counter(METRIC_PREFIX + name, value, (label,))
    for tier in chain_stats["tiers"]:
        name = str(tier["name"])
        seen = reported.setdefault(name, {})
        for key, suffix, _ in (*_TIER_COUNTERS, *_DECISION_COUNTERS):
            delta = int(tier.get(key, 0)) - seen.get(key, 0)
            if delta > 0:
                stats.increase_counter(METRIC_PREFIX + suffix, delta, (name,))
                seen[key] = int(tier.get(key, 0))
        stats.set_gauge(METRIC_PREFIX + _HEALTHY, 1.0 if tier.get("healthy") else 0.0, (name,))
        if isinstance(cost := tier.get("load_cost"), Mapping):
            stats.set_gauge(METRIC_PREFIX + "block_load_seconds", float(cost["block_s"]), (name,))
            stats.set_gauge(METRIC_PREFIX + "load_samples", int(cost.get("samples", 0)), (name,))
    if isinstance(model := chain_stats.get("recompute"), Mapping):
        stats.set_gauge(METRIC_PREFIX + _RECOMPUTE + "seconds_per_token",
                        float(model["per_token_s"]))
        stats.set_gauge(METRIC_PREFIX + _RECOMPUTE + "samples", int(model["samples"]))
        for source in _SOURCES:
            stats.set_gauge(METRIC_PREFIX + _RECOMPUTE + "source",
                            1.0 if model["source"] == source else 0.0, (source,))
    return None if stats.is_empty() else stats
