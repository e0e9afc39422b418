"""Per-tenant figures of a pool's tiers, out of its tenants' chains' stats.

Each tenant's chain (:class:`~kvtier.chain.tenants.Tenants`) counts its own
hits and misses per tier (:class:`~kvtier.observe.stats.TierStats`), so those
are the tenant's.  What a tenant holds, and what was refused, evicted or
expired of it, is the tier's to know: a tier that counts tenants reports, in
its backend's ``stats()``, ``tenant_bytes.<t>``, ``tenant_refused.<t>``,
``tenant_evicted.<t>``, ``tenant_expired.<t>``, ``tenant_kept_bytes.<t>`` and
``tenant_keep_refused.<t>`` (:data:`REPORTED`).  A store shared by processes
(the ``fs`` pool) can report every tenant of the pool that way, those this
process never opened included; they are listed too, with no hits or misses
(this process served them none).  Read in a round
(:mod:`kvtier.policies.tenant_round`), such a store reports every tenant once,
through the first of its instances, and each other instance its own tenant.

Where a tier reports no such key for a tenant, its figure comes from the
tenant's own chain: ``refused`` and ``evictions`` from the chain's counters
of that tier, ``expired`` from the backend's ``expired`` (0 where it has
none), ``used_bytes`` from the backend's ``own_used_bytes`` (a shared store:
what this instance wrote) or else its ``used_bytes``, ``kept_bytes`` from the
backend's ``kept_bytes`` (its tenant's; 0 where it keeps no marks), and
``keep_refused`` from the backend's ``keep_refused``, else the chain's counter
of that tier.  Those are exact for a
tier each tenant's instance has to itself (``host`` without tenant rules);
on a store that tenants share they are this process's view, which is why the
tiers' own keys win.  ``reported`` says which figures came from the tier.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["FIGURES", "REPORTED", "tenant_figures"]

#: The figures kept per tenant and tier, in order.
FIGURES = ("hits", "misses", "refused", "evictions", "expired", "used_bytes", "kept_bytes",
           "keep_refused")
#: The figure each backend stats key prefix reports: ``tenant_bytes.acme`` is acme's used_bytes.
REPORTED = {"tenant_bytes.": "used_bytes", "tenant_refused.": "refused",
            "tenant_evicted.": "evictions", "tenant_expired.": "expired",
            "tenant_kept_bytes.": "kept_bytes", "tenant_keep_refused.": "keep_refused"}


def _number(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _reports(chains: Mapping[str, Mapping[str, Any]], tier: int
             ) -> dict[str, dict[str, int]]:
    """Each tenant's figures that tier ``tier``'s backends report: a tenant's own
    chain's report first, else the largest of the others' (a shared store reports
    one truth through every instance, counted at slightly different moments)."""
    own: dict[str, dict[str, int]] = {}
    others: dict[str, dict[str, int]] = {}
    for tenant, stats in chains.items():
        backend = stats["tiers"][tier].get("backend_stats") or {}
        for key, value in backend.items():
            prefix, dot, named = str(key).partition(".")
            figure = REPORTED.get(prefix + dot)
            number = _number(value)
            if figure is None or number is None or not named:
                continue
            if named == tenant:
                own.setdefault(named, {})[figure] = number
            else:
                found = others.setdefault(named, {})
                found[figure] = max(found.get(figure, number), number)
    for tenant, figures in own.items():
        others.setdefault(tenant, {}).update(figures)
    return others


def _own_counters(tier: Mapping[str, Any]) -> dict[str, int]:
    """A tenant's figures of one tier from its own chain, where the tier reports none."""
    backend = tier.get("backend_stats") or {}
    used = _number(backend.get("own_used_bytes"))
    if used is None:
        used = _number(backend.get("used_bytes"))
    refused_marks = _number(backend.get("keep_refused"))
    return {"hits": tier["hits"], "misses": tier["misses"], "refused": tier["refused"],
            "evictions": tier["evictions"], "expired": _number(backend.get("expired")) or 0,
            "used_bytes": used or 0, "kept_bytes": _number(backend.get("kept_bytes")) or 0,
            "keep_refused": tier.get("keep_refused", 0) if refused_marks is None
            else refused_marks}


def tenant_figures(chains: Mapping[str, Mapping[str, Any]],
                   tier_names: list[str]) -> dict[str, dict[str, Any]]:
    """Per tenant: its ``used_bytes`` in all tiers, whether its chain is ``open`` here,
    and per tier name the :data:`FIGURES` and which of them the tier ``reported``.

    ``chains`` is each open tenant's :meth:`Chain.stats`, whose tiers are
    ``tier_names`` in order.
    """
    reports = [_reports(chains, i) for i in range(len(tier_names))]
    tenants = sorted(set(chains).union(*reports))
    out: dict[str, dict[str, Any]] = {}
    for tenant in tenants:
        stats = chains.get(tenant)
        tiers: dict[str, dict[str, Any]] = {}
        for i, name in enumerate(tier_names):
            figures = (_own_counters(stats["tiers"][i]) if stats is not None
                       else dict.fromkeys(FIGURES, 0))
            reported = reports[i].get(tenant, {})
            figures.update(reported)
            tiers[name] = {**figures, "reported": sorted(reported)}
        out[tenant] = {"open": stats is not None,
                       "used_bytes": sum(t["used_bytes"] for t in tiers.values()),
                       "tiers": tiers}
    return out
