"""Per-tenant figures: Tenants.stats(), and the real Prometheus endpoint (top N, other)."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from typing import Any

from kvtier.chain.tenants import open_tenants
from kvtier.observe.tenant_metrics import TopTenants, fold

BLOCK = 4096
_LINE = re.compile(r'^(\w+)\{(.*)\} (\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the endpoint: (metric, labels) -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {}
    for line in text.splitlines():
        found = _LINE.match(line)
        if found:
            samples[(found[1], frozenset(_LABEL.findall(found[2])))] = float(found[3])
    return samples


def per_tenant(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], metric: str
               ) -> dict[str, float]:
    """``metric``'s value per tenant label (tier ram)."""
    out = {}
    for (name, labels), value in samples.items():
        named = dict(labels)
        if name == metric and named.get("tier") == "ram":
            out[named["tenant"]] = value
    return out


def namespaces(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> set[str]:
    return {dict(labels)["namespace"] for name, labels in samples
            if name == "kvtier_tier_hits_total"}


def put(chain: Any, tag: bytes, count: int) -> None:
    keys = [tag + bytes([i]) for i in range(count)]
    chain.put(keys, [bytes([i]) * BLOCK for i in range(count)])


def test_tenants_stats_counts_each_tenant_s_hits_misses_and_bytes_per_tier() -> None:
    cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]}
    with open_tenants(cfg, "llama") as tenants:
        put(tenants.chain("acme"), b"a", 3)
        put(tenants.chain("globex"), b"a", 1)  # the same key: globex's own block
        out = [bytearray(BLOCK) for _ in range(4)]
        tenants.chain("acme").get([b"a\x00", b"a\x01", b"a\x02", b"zz"], out)
        assert out[2] == bytes([2]) * BLOCK
        tenants.chain("globex").get([b"a\x01", b"a\x00"], out[:2])
        assert out[1] == bytes([0]) * BLOCK
        stats = tenants.stats()
        held = {t: tenants.chain(t).stats()["tiers"][0]["backend_stats"][f"tenant_bytes.{t}"]
                for t in ("acme", "globex")}
    assert stats["namespace"] == tenants.namespace.for_tenant(None).hex
    acme, globex = stats["tenants"]["acme"], stats["tenants"]["globex"]
    assert {k: acme["tiers"]["ram"][k] for k in ("hits", "misses", "refused", "evictions")} == {
        "hits": 3, "misses": 1, "refused": 0, "evictions": 0}
    assert (globex["tiers"]["ram"]["hits"], globex["tiers"]["ram"]["misses"]) == (1, 1)
    # bytes held are the host tier's count of each tenant's blocks (headers included)
    assert acme["used_bytes"] == acme["tiers"]["ram"]["used_bytes"] == held["acme"]
    assert globex["used_bytes"] == held["globex"]
    assert 3 * BLOCK < held["acme"] < 3 * (BLOCK + 256) and BLOCK < held["globex"] < BLOCK + 256
    assert acme["tiers"]["ram"]["reported"] == ["evictions", "expired", "refused", "used_bytes"]


def test_prometheus_exports_the_top_tenants_and_sums_the_rest_as_other() -> None:
    """Scrape, change the ranking, scrape again after the interval: the tenant that left
    the top has no series left, and 'other' holds its figures."""
    port = free_port()
    cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}],
           "metrics": {"prometheus_port": port, "tenants_top": 2, "tenants_interval": "1s"}}
    with open_tenants(cfg, "llama") as tenants:
        put(tenants.chain("acme"), b"a", 3)
        put(tenants.chain("globex"), b"g", 2)
        put(tenants.chain("initech"), b"i", 1)
        tenants.chain("globex").get([b"g\x00", b"nope"], [bytearray(BLOCK)] * 2)
        tenants.chain("initech").get([b"nope", b"nah"], [bytearray(BLOCK)] * 2)
        ns = {t: tenants.chain(t).namespace.hex for t in ("acme", "globex", "initech")}
        first = scrape(port)
        figures = tenants.stats()["tenants"]
        used = per_tenant(first, "kvtier_tenant_used_bytes")
        assert used == {"acme": figures["acme"]["used_bytes"],
                        "globex": figures["globex"]["used_bytes"],
                        "other": figures["initech"]["used_bytes"]}
        assert per_tenant(first, "kvtier_tenant_hits_total") == {
            "acme": 0, "globex": 1, "other": 0}
        assert per_tenant(first, "kvtier_tenant_misses_total") == {
            "acme": 0, "globex": 1, "other": 2}
        assert first[("kvtier_tenants_in_other",
                      frozenset({("namespace", tenants.namespace.for_tenant(None).hex)}))] == 1
        # the per-tier families only for the top tenants' chains
        assert namespaces(first) == {ns["acme"], ns["globex"]}

        ranked = time.monotonic()
        put(tenants.chain("initech"), b"j", 8)  # initech now holds the most
        held_in_time = scrape(port)  # the ranking holds until the interval is over
        if time.monotonic() - ranked < 1.0:
            assert set(per_tenant(held_in_time, "kvtier_tenant_used_bytes")) == {
                "acme", "globex", "other"}
        time.sleep(max(0.0, 1.1 - (time.monotonic() - ranked)))
        second = scrape(port)
        figures = tenants.stats()["tenants"]
    assert set(per_tenant(second, "kvtier_tenant_used_bytes")) == {"initech", "acme", "other"}
    # globex left the top: none of its series remain, and 'other' is globex alone
    assert not [key for key in second if ("tenant", "globex") in key[1]]
    assert ns["globex"] not in namespaces(second) and ns["initech"] in namespaces(second)
    assert per_tenant(second, "kvtier_tenant_used_bytes")["other"] == (
        figures["globex"]["used_bytes"])
    assert per_tenant(second, "kvtier_tenant_hits_total")["other"] == 1
    assert per_tenant(second, "kvtier_tenant_misses_total") == {
        "initech": 2, "acme": 0, "other": 1}
    # closed: the pool is exported no more
    assert not [key for key in scrape(port) if key[0].startswith("kvtier_tenant")]


def test_the_ranking_holds_for_its_interval_and_never_names_other() -> None:
    now = [0.0]
    top = TopTenants(2, 60.0, clock=lambda: now[0])
    assert top.named({"a": 5, "b": 9, "c": 1, "other": 100}) == {"a", "b"}
    now[0] = 59.0
    assert top.named({"a": 5, "b": 9, "c": 50}) == {"a", "b"}
    now[0] = 60.0
    assert top.named({"a": 5, "b": 9, "c": 50}) == {"b", "c"}
    assert TopTenants(0, 1.0).named({"a": 1}) == frozenset()


def test_fold_sums_the_tenants_beyond_the_top_into_other() -> None:
    def tenant(hits: int, used: int) -> dict[str, Any]:
        figures = {"hits": hits, "misses": 1, "refused": 2, "evictions": 3, "expired": 4,
                   "used_bytes": used}
        return {"tiers": {"ram": figures}}

    rows = fold({"a": tenant(1, 10), "b": tenant(2, 20), "c": tenant(4, 40),
                 "other": tenant(8, 80)}, {"a"})
    assert rows["a"]["ram"] == {"hits": 1, "misses": 1, "refused": 2, "evictions": 3,
                                "expired": 4, "used_bytes": 10, "kept_bytes": 0,
                                "keep_refused": 0}
    assert rows["other"]["ram"] == {"hits": 14, "misses": 3, "refused": 6, "evictions": 9,
                                    "expired": 12, "used_bytes": 140, "kept_bytes": 0,
                                    "keep_refused": 0}
    assert set(rows) == {"a", "other"}


def _chain_stats(hits: int, misses: int, refused: int, evictions: int,
                 backend: dict[str, Any]) -> dict[str, Any]:
    return {"tiers": [{"hits": hits, "misses": misses, "refused": refused,
                       "evictions": evictions, "backend_stats": backend}]}


def test_figures_come_from_the_tier_s_tenant_keys_else_from_the_tenant_s_own_chain() -> None:
    from kvtier.observe.tenant_figures import tenant_figures

    chains = {
        # a tier that counts no tenants: its own counters, its own share of the store
        "acme": _chain_stats(5, 6, 7, 8, {"used_bytes": 900, "own_used_bytes": 300,
                                          "expired": 2}),
        # a shared store reporting every tenant of the pool, counted a moment apart
        "globex": _chain_stats(1, 2, 3, 4, {"tenant_bytes.globex": 50, "tenant_refused.globex": 9,
                                            "tenant_bytes.initech": 70,
                                            "tenant_evicted.initech": 1}),
        "hooli": _chain_stats(0, 0, 0, 0, {"tenant_bytes.initech": 75, "tenant_bytes.globex": 99,
                                           "tenant_bytes.hooli": 10, "tenant_bytes.": 5,
                                           "tenant_refused.hooli": "n/a"}),
    }
    out = tenant_figures(chains, ["disk"])
    assert out["acme"]["tiers"]["disk"] == {"hits": 5, "misses": 6, "refused": 7, "evictions": 8,
                                            "expired": 2, "used_bytes": 300, "kept_bytes": 0,
                                            "keep_refused": 0, "reported": []}
    # globex's own chain's report wins over another instance's
    assert out["globex"]["tiers"]["disk"] == {"hits": 1, "misses": 2, "refused": 9,
                                              "evictions": 4, "expired": 0, "used_bytes": 50,
                                              "kept_bytes": 0, "keep_refused": 0,
                                              "reported": ["refused", "used_bytes"]}
    # initech is open nowhere here: reported by the pool, the largest count, no hits
    assert out["initech"] == {"open": False, "used_bytes": 75, "tiers": {"disk": {
        "hits": 0, "misses": 0, "refused": 0, "evictions": 1, "expired": 0, "used_bytes": 75,
        "kept_bytes": 0, "keep_refused": 0, "reported": ["evictions", "used_bytes"]}}}
    assert out["hooli"]["tiers"]["disk"]["refused"] == 0 and out["hooli"]["used_bytes"] == 10
    assert sorted(out) == ["acme", "globex", "hooli", "initech"]
