"""Tenants in one tier: their quotas, weights and retention budgets, and the fair shares they give.

A tier entry's ``tenants`` key (:data:`TENANTS_OPTION`) names a rule per
tenant, and ``"*"`` for every tenant it does not name::

    tenants:
      "*": {quota: 2GiB}               # every tenant not named below
      acme: {quota: 10GiB, keep: 1GiB} # a quota, and a retention budget
      globex: {weight: 2}              # no quota: twice the share of a weight-1 tenant
      default: 1GiB                    # a size alone is a quota

- **quota**: the most bytes the tenant holds in the tier.  A put beyond it
  evicts the tenant's own blocks first, in the tier's eviction order; a block
  that cannot fit is refused and counted.
- **weight** (default 1): tenants without a quota share what the quotas leave
  of the capacity in proportion to their weights.
- **keep** (default 0): bytes of the tenant's blocks kept while marked
  (retention), at most its quota.

A tenant's **share** of a tier under pressure (:meth:`TenantRules.shares`):
its quota; or, without one, its weight's part of the capacity the quotas of
the tenants present leave.  Where the quotas of the tenants present add up to
more than the capacity, each quota'd tenant's share is its quota's part of
the capacity instead, and tenants without a quota have none guaranteed.

The **victim** of a full tier (:meth:`TenantRules.victim`) is the tenant
holding the most bytes beyond its share, counting the put that needs room as
its writer's.  So a tenant within its share loses no block to another while
any tenant is beyond its own: a noisy tenant evicts itself, not a quiet one.
While the quotas of the tenants present fit the capacity, no tenant within
its quota ever loses a block to another tenant.

Every tier that counts tenants (host, fs, the ``redis`` backend) applies these
two rules.  The ``redis`` backend applies them on the server, in Lua (its
``_scripts.py``, ``victim``), step for step as :meth:`TenantRules.victim` and
:meth:`TenantRules.shares` do here: a change to either must be made to both,
and its tests check that the two agree on a set of cases.  The tenant of a
backend instance is its ``tenant`` option (:data:`TENANT_OPTION`, set by the
chain from the namespace).  A tier's
``expire`` (:data:`EXPIRE_OPTION`) says when its blocks expire.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtier.plugins.options import parse_duration, parse_size
from kvtier.spec import Option

__all__ = ["ANY_TENANT", "EXPIRE_OPTION", "TENANTS_OPTION", "TENANT_OPTION", "Expiry",
           "TenantRule", "TenantRules", "parse_expiry", "parse_tenants"]

#: The key of the rule for every tenant a ``tenants`` mapping does not name.
ANY_TENANT = "*"
# the tenant names kvtier.block.namespace accepts (it cannot be imported here)
_TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}")
_RULE_KEYS = ("quota", "weight", "keep")
#: Sets of tenants whose shares a TenantRules remembers.
_SHARES_KEPT = 256


@dataclass(frozen=True)
class TenantRule:
    """One tenant's rule in a tier."""

    #: Bytes the tenant may hold; None: no quota (it shares by weight).
    quota: int | None = None
    #: Its part of what quotas leave, against other tenants without a quota.
    weight: float = 1.0
    #: Bytes of its blocks kept while marked (retention budget).
    keep: int = 0


@dataclass(frozen=True)
class TenantRules:
    """The ``tenants`` of one tier: a rule per tenant named, and ``"*"`` for the rest."""

    named: Mapping[str, TenantRule] = field(default_factory=dict)
    # shares by (tenants present, capacity): a tier asks on every eviction, and the
    # answer changes only when a tenant comes or goes (with the loop in victim, giver
    # for two tenants went from 5.5 to 1.9 us)
    _shares: dict[tuple[frozenset[str], int], dict[str, int]] = field(
        default_factory=dict, init=False, compare=False, repr=False)

    def __bool__(self) -> bool:
        return bool(self.named)

    def rule(self, tenant: str) -> TenantRule:
        """``tenant``'s rule: its own, else ``"*"``'s, else no quota and weight 1."""
        found = self.named.get(tenant) or self.named.get(ANY_TENANT)
        return found if found is not None else TenantRule()

    def quota(self, tenant: str) -> int | None:
        return self.rule(tenant).quota

    def shares(self, tenants: Iterable[str], capacity: int) -> dict[str, int]:
        """Each of ``tenants``' share of ``capacity`` bytes under pressure (module docstring)."""
        return dict(self._shares_cached(tenants, capacity))

    def _shares_cached(self, tenants: Iterable[str], capacity: int) -> Mapping[str, int]:
        """:meth:`shares`, remembered: not to be changed."""
        present = frozenset(tenants)
        cached = self._shares.get((present, capacity))
        if cached is None:
            if len(self._shares) >= _SHARES_KEPT:
                self._shares.clear()
            cached = self._shares[(present, capacity)] = self._shares_of(present, capacity)
        return cached

    def _shares_of(self, tenants: Iterable[str], capacity: int) -> dict[str, int]:
        rules = {t: self.rule(t) for t in tenants}
        quotas = {t: min(r.quota, capacity) for t, r in rules.items() if r.quota is not None}
        total = sum(quotas.values())
        shares: dict[str, int] = {}
        if total > capacity:  # oversubscribed: each its quota's part of the capacity
            shares = {t: capacity * q // total for t, q in quotas.items()}
        else:
            shares = dict(quotas)
        rest = max(0, capacity - sum(shares.values()))
        weights = {t: r.weight for t, r in rules.items() if r.quota is None}
        weight = sum(weights.values())
        for t, w in weights.items():
            shares[t] = int(rest * w / weight) if weight else 0
        return shares

    def victim(self, held: Mapping[str, int], capacity: int, writer: str, size: int) -> str:
        """The tenant that gives up its next victim so that ``writer`` can put ``size`` bytes.

        ``held`` is every tenant's bytes in the tier.  The tenant most beyond its share,
        counting ``size`` as ``writer``'s; on a tie, the writer.
        """
        tenants = {t for t, n in held.items() if n > 0}
        tenants.add(writer)
        shares = self._shares_cached(tenants, capacity)
        # the writer first: it wins a tie; then by name, the first of equals
        victim, most = writer, held.get(writer, 0) + size - shares[writer]
        for tenant in sorted(tenants):
            if tenant != writer and held[tenant] - shares[tenant] > most:
                victim, most = tenant, held[tenant] - shares[tenant]
        return victim

    def giver(self, held: Mapping[str, int], capacity: int, writer: str,
              size: int) -> str | None:
        """The tenant that gives up a block for ``writer``'s put, or None: refuse the put.

        The :meth:`victim`; where that is the writer, holding nothing, the tenant
        most beyond its share among the others that are beyond it.  None where no
        tenant but the writer is beyond its share: the put would take a block from a
        tenant within its share.
        """
        victim = self.victim(held, capacity, writer, size)
        if held.get(victim, 0) > 0:
            return victim
        others = {t: n for t, n in held.items() if n > 0 and t != writer}
        shares = self.shares([*others, writer], capacity)
        beyond = {t: n - shares[t] for t, n in others.items() if n > shares[t]}
        return max(sorted(beyond), key=beyond.__getitem__) if beyond else None

    def canonical(self) -> str:
        """The rules as one line of JSON: processes sharing a tier compare it."""
        return json.dumps({t: [r.quota, r.weight, r.keep] for t, r in sorted(self.named.items())},
                          separators=(",", ":"))


def parse_tenants(value: Any) -> TenantRules:
    """The ``tenants`` mapping as :class:`TenantRules`; a ``ValueError`` says what is wrong."""
    if value is None:
        return TenantRules()
    if isinstance(value, TenantRules):
        return value
    if not isinstance(value, Mapping):
        raise ValueError("expected a mapping of tenant to {quota, weight, keep} "
                         f"(docs/tenants.md), got {value!r}")
    named: dict[str, TenantRule] = {}
    for tenant, given in value.items():
        tenant = str(tenant)
        if tenant != ANY_TENANT and not _TENANT_RE.fullmatch(tenant):
            raise ValueError(f"{tenant!r} is no tenant: 1 to 64 characters, letters, digits "
                             "and _ . : @ - (not first), or '*' for every other tenant")
        named[tenant] = _rule(tenant, given)
    return TenantRules(named)


def _rule(tenant: str, given: Any) -> TenantRule:
    if isinstance(given, TenantRule):
        return given
    if not isinstance(given, Mapping):  # a size alone is a quota
        given = {"quota": given}
    unknown = sorted(set(map(str, given)) - set(_RULE_KEYS))
    if unknown:
        raise ValueError(f"tenant {tenant!r}: unknown key {unknown[0]!r}; a tenant's rule "
                         f"takes {', '.join(_RULE_KEYS)}")
    try:
        quota = None if given.get("quota") is None else parse_size(given["quota"])
        keep = parse_size(given.get("keep", 0))
        weight = given.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ValueError(f"a weight is a number above 0, got {weight!r}")
    except ValueError as exc:
        raise ValueError(f"tenant {tenant!r}: {exc}") from None
    if quota == 0:
        raise ValueError(f"tenant {tenant!r}: a quota of 0 bytes refuses every put; "
                         "give at least 1 byte, or leave it unset")
    if not math.isfinite(weight) or weight <= 0:
        raise ValueError(f"tenant {tenant!r}: a weight is a number above 0, got {weight!r}")
    if quota is not None and keep > quota:
        raise ValueError(f"tenant {tenant!r}: keep ({keep} bytes) is more than its quota "
                         f"({quota} bytes)")
    return TenantRule(quota=quota, weight=float(weight), keep=keep)


@dataclass(frozen=True)
class Expiry:
    """When a tier's blocks expire: ``after`` seconds from their write, or ``unused``
    seconds after their last read or write; None: never."""

    after: float | None = None
    unused: float | None = None

    def __bool__(self) -> bool:
        return self.after is not None or self.unused is not None


def parse_expiry(value: Any) -> Expiry:
    """``expire: 1d`` (after its write) or ``expire: {after: 1d, unused: 1h}``."""
    if value is None or isinstance(value, Expiry):
        return value or Expiry()
    if not isinstance(value, Mapping):
        value = {"after": value}
    unknown = sorted(set(map(str, value)) - {"after", "unused"})
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; expire takes a duration, or "
                         "after and unused")
    parsed = {k: None if value.get(k) is None else parse_duration(value[k])
              for k in ("after", "unused")}
    for k, seconds in parsed.items():
        if seconds is not None and seconds <= 0:
            raise ValueError(f"{k} must be longer than 0s")
    return Expiry(**parsed)


TENANTS_OPTION = Option(
    "map", "each tenant's quota, weight and retention budget in this tier, '*' for every "
    "other (docs/tenants.md)", parse=parse_tenants, key="tenants")
TENANT_OPTION = Option(
    "str", "the tenant whose blocks this instance holds: the chain sets it from the "
    "namespace", default="default", internal=True, key="tenant")
EXPIRE_OPTION = Option(
    "map", "when this tier's blocks expire: a duration after their write, or after and "
    "unused (since their last use)", parse=parse_expiry, key="expire")
