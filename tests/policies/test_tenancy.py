"""The tenants' rules of a tier: parsing, shares and the victim of a full tier."""

from __future__ import annotations

import random

import pytest

from kvtier.policies.tenancy import (
    Expiry,
    TenantRule,
    TenantRules,
    parse_expiry,
    parse_tenants,
)

MiB = 1 << 20


def test_a_mapping_parses_sizes_weights_and_the_rule_for_every_other_tenant() -> None:
    rules = parse_tenants({"*": {"quota": "2MiB"}, "acme": {"quota": "10MiB", "keep": "1MiB"},
                           "globex": {"weight": 2}, "default": "1MiB"})
    assert rules.rule("acme") == TenantRule(quota=10 * MiB, weight=1.0, keep=MiB)
    assert rules.rule("globex") == TenantRule(quota=None, weight=2.0)
    assert rules.rule("default") == TenantRule(quota=MiB)
    assert rules.rule("initech") == TenantRule(quota=2 * MiB)  # the '*' rule
    assert parse_tenants(None).rule("anyone") == TenantRule()
    assert not parse_tenants(None) and rules


@pytest.mark.parametrize(("value", "says"), [
    ({"acme": {"quota": 0}}, "refuses every put"),
    ({"acme": {"weight": 0}}, "above 0"),
    ({"acme": {"weight": float("nan")}}, "above 0"),
    ({"acme": {"weight": True}}, "above 0"),
    ({"acme": {"quota": "1MiB", "keep": "2MiB"}}, "more than its quota"),
    ({"acme": {"qouta": "1MiB"}}, "unknown key 'qouta'"),
    ({"-bad": "1MiB"}, "is no tenant"),
    ({"acme": {"quota": "lots"}}, "tenant 'acme': expected a size"),
    (["acme"], "expected a mapping"),
])
def test_bad_rules_are_refused_saying_why(value: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_tenants(value)


def test_shares_give_quotas_then_split_the_rest_by_weight() -> None:
    rules = TenantRules({"a": TenantRule(quota=30), "b": TenantRule(weight=1.0),
                         "c": TenantRule(weight=3.0)})
    assert rules.shares({"a", "b", "c"}, 110) == {"a": 30, "b": 20, "c": 60}
    # oversubscribed quotas: each its quota's part; tenants without one get nothing
    over = TenantRules({"*": TenantRule(quota=100)})
    assert over.shares({"x", "y"}, 100) == {"x": 50, "y": 50}


def test_the_victim_is_the_tenant_most_beyond_its_share_and_never_a_quiet_one() -> None:
    rules = TenantRules()  # equal weights: a share of 50 each in 100 bytes
    held = {"noisy": 90, "quiet": 10}
    assert rules.victim(held, 100, "noisy", 10) == "noisy"
    assert rules.victim(held, 100, "quiet", 10) == "noisy"
    # the quiet tenant within its share is no victim even of its own puts
    assert rules.victim({"noisy": 55, "quiet": 45}, 100, "quiet", 5) == "noisy"
    # a tie: the writer gives up its own
    assert rules.victim({"a": 50, "b": 50}, 100, "a", 0) == "a"


def test_a_tenant_within_its_quota_loses_nothing_while_the_quotas_fit() -> None:
    rules = TenantRules({"a": TenantRule(quota=40), "b": TenantRule(quota=60)})
    assert rules.victim({"a": 40, "b": 60}, 100, "b", 10) == "b"
    assert rules.victim({"a": 40, "b": 60}, 100, "a", 10) == "a"


def test_the_canonical_form_tells_different_rules_apart() -> None:
    one = parse_tenants({"acme": "1MiB"})
    assert one.canonical() == parse_tenants({"acme": {"quota": MiB}}).canonical()
    assert one.canonical() != parse_tenants({"acme": "2MiB"}).canonical()


def test_expiry_takes_a_duration_or_after_and_unused() -> None:
    assert parse_expiry("1h") == Expiry(after=3600.0)
    assert parse_expiry({"unused": "10m"}) == Expiry(unused=600.0)
    assert not parse_expiry(None)
    with pytest.raises(ValueError, match="unknown key 'idle'"):
        parse_expiry({"idle": "1m"})
    with pytest.raises(ValueError, match="longer than 0s"):
        parse_expiry("0s")


def test_the_giver_is_never_a_tenant_within_its_share() -> None:
    rules = TenantRules()
    # the writer most beyond, holding nothing: another beyond its share gives instead
    assert rules.giver({"a": 60, "b": 0}, 100, "b", 60) == "a"
    # no one but the writer beyond: refuse
    assert rules.giver({"a": 50, "b": 0}, 100, "b", 60) is None
    # the writer holding blocks gives its own
    assert rules.giver({"a": 50, "b": 40}, 100, "b", 60) == "b"


def _victim_as_written(rules: TenantRules, held: dict[str, int], capacity: int, writer: str,
                       size: int) -> str:
    """The victim rule as the module docstring says it, written plainly (the model)."""
    tenants = {t for t, n in held.items() if n > 0} | {writer}
    shares = rules.shares(tenants, capacity)

    def beyond(tenant: str) -> tuple[int, bool]:
        mine = held.get(tenant, 0) + (size if tenant == writer else 0)
        return mine - shares[tenant], tenant == writer

    return max(sorted(tenants), key=beyond)


def test_the_victim_is_the_model_s_on_random_tiers() -> None:
    rng = random.Random(39)
    rules = parse_tenants({"a": {"quota": 300}, "b": {"weight": 3}, "*": {"weight": 1}})
    for _ in range(2000):
        held = {t: rng.choice([0, 0, 50, 100, 250, 400]) for t in "abcd"}
        writer, size = rng.choice("abcde"), rng.choice([1, 50, 200])
        want = _victim_as_written(rules, held, 1000, writer, size)
        assert rules.victim(held, 1000, writer, size) == want, (held, writer, size)
    shares = rules.shares("abc", 1000)
    shares["a"] = 0  # a caller's copy: the remembered shares stay
    assert rules.shares("abc", 1000)["a"] == 300
