"""One read of a pool's per-tenant figures costs O(tenants), not O(tenants^2).

Every tenant's chain opens its own instance of the ``fs`` tier, and the shared
pool reports every tenant's figures through each: read one by one, N chains'
stats carried N copies of N tenants' figures, each read from the index
(97 s for 1,000 tenants).  ``Tenants.stats()`` reads them in one round
(:mod:`kvtier.policies.tenant_round`): one instance reports every tenant, the
others their own, and the figures are the same, byte for byte.
"""

from __future__ import annotations

import time
from pathlib import Path

from kvtier.block import framing
from kvtier.block.framing import Codec
from kvtier.block.namespace import Namespace
from kvtier.chain.tenants import open_tenants
from kvtier.policies.tenant_round import read_once, tenant_round

MODEL = Namespace(model="llama-test")
TENANTS = [f"t{i:02d}" for i in range(12)]


def framed(tenant: str, key: bytes, payload: bytes) -> int:
    ns = MODEL.for_tenant(tenant)
    return len(framing.encode(ns.fingerprint, key, payload, Codec(tenant=tenant.encode())))


def test_a_round_reads_a_pool_s_tenants_once_and_reports_them_once(tmp_path: Path) -> None:
    config = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/kv",
                         "capacity": "4MiB", "capacity_scope": "pool", "direct_io": False,
                         "tenants": {"*": {"quota": "256KiB"}}}]}
    with open_tenants(config, MODEL) as tenants:
        for i, tenant in enumerate(TENANTS):
            blocks = [bytes([i]) * (1000 + 100 * i)] * (i % 3 + 1)
            keys = [b"k%d" % j for j in range(len(blocks))]
            assert tenants.chain(tenant).put(keys, blocks) == [True] * len(blocks)
        time.sleep(0.3)  # the rows of the puts, made within 50 ms
        _, figures, chains = tenants.tenant_snapshot()
        alone = {t: tenants.chain(t).stats() for t in TENANTS}  # each read on its own
    reported = [sum(1 for key in stats["tiers"][0]["backend_stats"]
                    if key.startswith("tenant_bytes.")) for stats in chains.values()]
    # in the round: one instance reports the 12 tenants, each other one its own
    assert sorted(reported) == [1] * 11 + [12]
    # on its own, each instance reports every tenant of the pool, as before
    assert all(sum(1 for key in stats["tiers"][0]["backend_stats"]
                   if key.startswith("tenant_bytes.")) == 12 for stats in alone.values())
    for i, tenant in enumerate(TENANTS):
        count = i % 3 + 1
        want = sum(framed(tenant, b"k%d" % j, bytes([i]) * (1000 + 100 * i))
                   for j in range(count))
        assert figures[tenant]["tiers"]["disk"]["used_bytes"] == want
        assert "used_bytes" in figures[tenant]["tiers"]["disk"]["reported"]
    assert sorted(figures) == TENANTS


def test_read_once_reads_each_store_once_per_round() -> None:
    reads: list[str] = []

    def read(name: str) -> str:
        reads.append(name)
        return name.upper()

    assert read_once("a", lambda: read("a")) == ("A", True)  # outside a round: every time
    assert read_once("a", lambda: read("a")) == ("A", True)
    with tenant_round():
        assert read_once("a", lambda: read("a")) == ("A", True)
        with tenant_round():  # inside another: the outer round
            assert read_once("a", lambda: read("a")) == ("A", False)
        assert read_once("b", lambda: read("b")) == ("B", True)
        assert read_once("a", lambda: read("a")) == ("A", False)
    with tenant_round():  # a new round reads again
        assert read_once("a", lambda: read("a")) == ("A", True)
    assert reads == ["a", "a", "a", "b", "a"]
