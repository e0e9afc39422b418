"""TenantRouter: one chain's batch API over tenants' chains, by tenant-qualified keys."""

from __future__ import annotations

import time
from typing import Any

from kvtier.chain.tenant_router import TenantRouter, qualify, unqualify
from kvtier.chain.tenants import open_tenants

CONFIG = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]}
BLOCK = 256


def done(router: TenantRouter, job_id: int) -> Any:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for res in router.poll():
            if res.job_id == job_id:
                return res
        router.wait([job_id], 0.05)
    raise AssertionError(f"job {job_id} never finished")


def test_a_mixed_batch_goes_to_each_tenants_chain_in_order() -> None:
    with open_tenants(CONFIG, "m") as tenants:
        router = TenantRouter(tenants.chain)
        keys = [qualify("acme", b"k1"), qualify("globex", b"k1"), qualify("acme", b"k2")]
        blocks = [bytes([n]) * BLOCK for n in (1, 2, 3)]
        assert done(router, router.submit_put(keys, blocks)).result == [True] * 3
        # the same key of two tenants: two blocks, each in its tenant's chain
        assert tenants.chain("acme").get_bytes([b"k1", b"k2"]) == [blocks[0], blocks[2]]
        assert tenants.chain("globex").get_bytes([b"k1", b"k2"]) == [blocks[1], None]
        asked = [qualify("globex", b"k2"), *keys]
        assert done(router, router.submit_lookup(asked)).result == [None, 0, 0, 0]
        out = [bytearray(BLOCK) for _ in asked]
        got = done(router, router.submit_get(asked, out))
        assert got.kind == "get" and got.result == [False, True, True, True]
        assert [bytes(b) for b in out[1:]] == blocks and not any(out[0])
        assert router.evict_each([qualify("globex", b"k1"), qualify("globex", b"k2")]) == [
            True, False]
        assert tenants.chain("acme").lookup([b"k1"]) == [0]


def test_a_tenant_whose_chain_fails_to_open_misses_alone() -> None:
    with open_tenants(CONFIG, "m") as tenants:
        tries = []

        def chain_of(tenant: str) -> Any:
            if tenant == "down":
                tries.append(tenant)
                raise OSError("unreachable")
            return tenants.chain(tenant)

        router = TenantRouter(chain_of, retry_after=0.2)
        keys = [qualify("down", b"k"), qualify("up", b"k")]
        blocks = [b"\x01" * BLOCK, b"\x02" * BLOCK]
        assert done(router, router.submit_put(keys, blocks)).result == [False, True]
        assert router.put(keys, blocks) == [False, True]  # within retry_after: not tried
        assert tries == ["down"]
        # only the failing tenant's keys: done at once, every key a miss
        assert done(router, router.submit_lookup(keys[:1])).result == [None]
        time.sleep(0.25)
        assert router.put(keys, blocks) == [False, True]
        assert tries == ["down", "down"]


def test_qualified_keys_round_trip() -> None:
    # a key may hold NUL bytes; a tenant name cannot, so the first NUL splits them
    assert unqualify(qualify("acme", b"\x00\x01k\x00")) == ("acme", b"\x00\x01k\x00")


def test_reads_that_miss_try_the_fallback_and_writes_never_do() -> None:
    with open_tenants(CONFIG, "m") as tenants:
        def shared(qualified: bytes) -> bytes | None:
            tenant, key = unqualify(qualified)
            return None if tenant == "default" else qualify("default", key)

        router = TenantRouter(tenants.chain, fallback=shared)
        public, own = b"\x05" * BLOCK, b"\x06" * BLOCK
        tenants.chain(None).put([b"sys", b"both"], [public, public])
        tenants.chain("acme").put([b"both"], [own])
        keys = [qualify("acme", k) for k in (b"sys", b"both", b"none")]
        # a hit in the tenant's own chain is tier 0: it stays a hit, its own block is read
        assert done(router, router.submit_lookup(keys)).result == [0, 0, None]
        out = [bytearray(BLOCK) for _ in keys]
        assert done(router, router.submit_get(keys, out)).result == [True, True, False]
        assert [bytes(b) for b in out[:2]] == [public, own]
        assert router.get_bytes(keys) == [public, own, None]
        # puts and evictions stay in the tenant's own chain
        assert router.evict_each(keys[:1]) == [False]
        assert tenants.chain(None).lookup([b"sys"]) == [0]
