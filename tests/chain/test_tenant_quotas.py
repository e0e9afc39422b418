"""Quotas and fair share of the tenants of one process, through open_tenants, on a real host tier.

The tenants' chains of one :class:`~kvtier.chain.tenants.Tenants` share one
host capacity.  Each claim is read back through the chains: exact bytes for
every block a tenant keeps, misses for the ones it lost, and the per-tenant
figures of the tier's stats.
"""

from __future__ import annotations

import random
from typing import Any

from kvtier.chain.chain import Chain
from kvtier.chain.tenants import open_tenants

MODEL = {"model": "quota-test", "dtype": "bfloat16", "tokens_per_block": 16}
SIZE = 64 << 10
MiB = 1 << 20


def payload(tenant: str, i: int) -> bytes:
    return random.Random(f"{tenant}/{i}").randbytes(SIZE)


def keys(tenant: str, n: int) -> list[bytes]:
    return [f"{tenant}-{i}".encode().ljust(16, b".") for i in range(n)]


def ram(capacity: int, **over: Any) -> dict[str, Any]:
    return {"chain": [{"name": "ram", "backend": "host", "capacity": capacity, **over}]}


def write(chain: Chain, tenant: str, n: int) -> None:
    """``n`` blocks, one put each, as a prompt's blocks arrive."""
    for i, key in enumerate(keys(tenant, n)):
        assert chain.put([key], [payload(tenant, i)]) == [True]


def kept(chain: Chain, tenant: str, n: int) -> list[int]:
    """The indices of ``tenant``'s blocks the chain returns; each must be exact."""
    out = []
    for i, key in enumerate(keys(tenant, n)):
        buf = bytearray(SIZE)
        if chain.get([key], [buf]) == [True]:
            assert bytes(buf) == payload(tenant, i), (tenant, i)
            out.append(i)
    return out


def ram_stats(chain: Chain) -> dict[str, Any]:
    stats: dict[str, Any] = chain.stats()["tiers"][0]["backend_stats"]
    return stats


def frame(chain: Chain) -> int:
    """Bytes one stored block takes in the tier (payload and header)."""
    stats = ram_stats(chain)
    return int(stats["used_bytes"] // stats["blocks"])


def test_a_noisy_tenant_beyond_its_quota_evicts_only_its_own_blocks() -> None:
    config = ram(MiB, tenants={"noisy": {"quota": "256KiB"}})
    with open_tenants(config, MODEL) as tenants:
        quiet, noisy = tenants.chain("quiet"), tenants.chain("noisy")
        write(quiet, "quiet", 8)
        one = frame(quiet)
        write(noisy, "noisy", 40)  # ten times its quota
        assert kept(quiet, "quiet", 8) == list(range(8))
        fits = (256 << 10) // one
        assert kept(noisy, "noisy", 40) == list(range(40 - fits, 40))
        stats = ram_stats(quiet)
        assert stats["tenant_bytes.quiet"] == 8 * one and stats["tenant_evicted.quiet"] == 0
        stats = ram_stats(noisy)
        assert stats["tenant_bytes.noisy"] == fits * one <= 256 << 10
        assert stats["tenant_evicted.noisy"] == 40 - fits
        assert stats["used_bytes"] == (8 + fits) * one  # one capacity: both tenants in it


def test_tenants_without_quotas_share_one_capacity_and_keep_their_share() -> None:
    with open_tenants(ram(MiB), MODEL) as tenants:
        quiet, noisy = tenants.chain("quiet"), tenants.chain("noisy")
        write(quiet, "quiet", 6)  # within its half of the capacity
        one = frame(quiet)
        write(noisy, "noisy", 80)  # ten times its share
        assert kept(quiet, "quiet", 6) == list(range(6))
        # what the quiet tenant leaves of the one capacity, not a capacity of its own
        fits = (MiB - 6 * one) // one
        assert kept(noisy, "noisy", 80) == list(range(80 - fits, 80))
        assert ram_stats(noisy)["used_bytes"] <= MiB
        assert ram_stats(quiet)["tenant_evicted.quiet"] == 0


def test_weights_give_each_writer_its_part() -> None:
    config = ram(MiB, tenants={"heavy": {"weight": 3}, "light": {"weight": 1}})
    with open_tenants(config, MODEL) as tenants:
        heavy, light = tenants.chain("heavy"), tenants.chain("light")
        for i, (hk, lk) in enumerate(zip(keys("heavy", 40), keys("light", 40))):
            assert heavy.put([hk], [payload("heavy", i)]) == [True]
            assert light.put([lk], [payload("light", i)]) == [True]
        one = frame(heavy)
        held_heavy, held_light = kept(heavy, "heavy", 40), kept(light, "light", 40)
        # each holds its newest blocks, about its share: 3/4 and 1/4 of the capacity
        assert held_heavy == list(range(40 - len(held_heavy), 40))
        assert held_light == list(range(40 - len(held_light), 40))
        assert abs(len(held_heavy) * one - 3 * MiB // 4) <= one
        assert abs(len(held_light) * one - MiB // 4) <= one


def test_a_block_over_its_tenants_quota_is_refused_and_counted() -> None:
    with open_tenants(ram(MiB, tenants={"small": {"quota": "32KiB"}}), MODEL) as tenants:
        small = tenants.chain("small")
        assert small.put(keys("small", 1), [payload("small", 0)]) == [False]
        assert kept(small, "small", 1) == []
        assert ram_stats(small)["tenant_refused.small"] == 1
        other = tenants.chain("other")  # the '*' rule: no quota
        write(other, "other", 1)
        assert kept(other, "other", 1) == [0]
