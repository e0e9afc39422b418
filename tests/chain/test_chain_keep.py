"""Retention through the chain on the host tier: kept blocks survive pressure byte for
byte, the tenant's keep budget bounds the marks, release lets them go, and expiry wins."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from plain_store import PlainStore

from kvtier import open_chain
from kvtier.chain import Chain
from kvtier.chain.tenants import open_tenants
from kvtier.plugins.registry import BackendRegistry

BLOCK = 1000


def block(i: int) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(BLOCK))


def keys(ids: Sequence[int], tag: bytes = b"keep") -> list[bytes]:
    return [tag + i.to_bytes(4, "big") for i in ids]


def ram(capacity: str = "8KiB", tenants: object = None, **more: object) -> dict[str, object]:
    tier: dict[str, object] = {"name": "ram", "backend": "host", "capacity": capacity, **more}
    if tenants is not None:
        tier["tenants"] = tenants
    return {"chain": [tier]}


def exact(chain: Chain, ids: Sequence[int], tag: bytes = b"keep") -> list[int]:
    """The ids read back; a wrong byte fails the test."""
    got = chain.get_bytes(keys(ids, tag))
    out = []
    for i, data in zip(ids, got, strict=True):
        if data is not None:
            assert data == block(i), i
            out.append(i)
    return out


def flood(chain: Chain, ids: Sequence[int], tag: bytes = b"keep") -> None:
    for i in ids:  # one by one: each put evicts
        chain.put(keys([i], tag), [block(i)])


def test_kept_blocks_survive_pressure_byte_for_byte_and_the_unkept_go() -> None:
    with open_chain(ram(tenants={"*": {"keep": "4KiB"}}), {"model": "keep"}) as chain:
        chain.put(keys(range(6)), [block(i) for i in range(6)])
        assert chain.keep(keys([0, 2, 4])) == [True, True, True]
        flood(chain, range(100, 160))
        assert exact(chain, range(6)) == [0, 2, 4]  # 1, 3, 5 were evicted
        tier = chain.stats()["tiers"][0]
        assert tier["backend_stats"]["kept_blocks"] == 3
        assert tier["keep_refused"] == 0


def test_without_keep_the_same_flood_evicts_them() -> None:
    # the control: the blocks above survive by their marks, not by the flood's shape
    with open_chain(ram(tenants={"*": {"keep": "4KiB"}}), {"model": "keep"}) as chain:
        chain.put(keys(range(6)), [block(i) for i in range(6)])
        flood(chain, range(100, 160))
        assert exact(chain, range(6)) == []


def test_marks_beyond_the_tenant_s_budget_are_refused_and_counted() -> None:
    # frames are the payload and a header: two fit 2500 bytes, three do not
    with open_chain(ram(tenants={"*": {"keep": 2500}}), {"model": "keep"}) as chain:
        chain.put(keys(range(4)), [block(i) for i in range(4)])
        assert chain.keep(keys(range(4))) == [True, True, False, False]
        assert chain.keep(keys([0])) == [True]  # kept again: counted once
        assert chain.keep(keys([77])) == [False]  # not held
        tier = chain.stats()["tiers"][0]
        assert tier["keep_refused"] == 2
        assert tier["backend_stats"]["keep_refused"] == 2
        assert tier["backend_stats"]["kept_bytes"] <= 2500
        flood(chain, range(100, 160))
        assert exact(chain, range(4)) == [0, 1]


def test_no_budget_keeps_nothing() -> None:
    with open_chain(ram(), {"model": "keep"}) as chain:
        chain.put(keys([1]), [block(1)])
        assert chain.keep(keys([1])) == [False]
        assert chain.stats()["tiers"][0]["keep_refused"] == 1


def test_release_lets_them_go() -> None:
    with open_chain(ram(tenants={"*": {"keep": "4KiB"}}), {"model": "keep"}) as chain:
        chain.put(keys(range(3)), [block(i) for i in range(3)])
        assert chain.keep(keys(range(3))) == [True] * 3
        flood(chain, range(100, 130))
        assert exact(chain, range(3)) == [0, 1, 2]
        assert chain.release(keys([0, 1, 2, 99])) == [True, True, True, False]
        assert chain.stats()["tiers"][0]["backend_stats"]["kept_bytes"] == 0
        flood(chain, range(200, 230))
        assert exact(chain, range(3)) == []


def test_a_kept_block_still_expires() -> None:
    """Expiry wins over keep: a kept block is a miss once expired, and its mark is gone."""
    config = ram(tenants={"*": {"keep": "4KiB"}}, expire="300ms")
    with open_chain(config, {"model": "keep"}) as chain:
        chain.put(keys([1, 2]), [block(1), block(2)])
        assert chain.keep(keys([1])) == [True]
        time.sleep(0.5)
        assert exact(chain, [1, 2]) == []
        stats = chain.stats()["tiers"][0]["backend_stats"]
        assert (stats["expired"], stats["kept_bytes"]) == (2, 0)
        assert chain.keep(keys([1])) == [False]


def test_a_put_that_only_kept_blocks_could_make_room_for_is_refused() -> None:
    # a quota of four blocks, all four kept: a fifth of the tenant is refused, and none
    # of the kept ones leaves
    rules = {"*": {"quota": 4 * 1100, "keep": 4 * 1100}}
    with open_chain(ram(capacity="64KiB", tenants=rules), {"model": "keep"}) as chain:
        chain.put(keys(range(4)), [block(i) for i in range(4)])
        assert chain.keep(keys(range(4))) == [True] * 4
        assert chain.put(keys([9]), [block(9)]) == [False]
        assert exact(chain, range(4)) == [0, 1, 2, 3]
        chain.release(keys([0]))
        assert chain.put(keys([9]), [block(9)]) == [True]
        assert exact(chain, [0, 1, 2, 3, 9]) == [1, 2, 3, 9]


@pytest.mark.parametrize("eviction", ["lru", "arc", "s3fifo", "adaptive"])
def test_every_eviction_policy_spares_kept_blocks(eviction: str) -> None:
    config = ram(tenants={"*": {"keep": "3KiB"}}, eviction=eviction)
    with open_chain(config, {"model": "keep"}) as chain:
        chain.put(keys(range(4)), [block(i) for i in range(4)])
        assert chain.keep(keys([1, 3])) == [True, True]
        for _ in range(3):
            flood(chain, range(100, 140))
            exact(chain, range(100, 140))  # uses: frequency-aware policies see them
        assert exact(chain, range(4)) == [1, 3]
        assert chain.stats()["tiers"][0]["backend_stats"]["used_bytes"] <= 8 << 10


def test_a_tenant_s_kept_blocks_survive_another_tenant_s_flood() -> None:
    rules = {"acme": {"quota": "4KiB", "keep": "2KiB"}, "globex": {"quota": "6KiB"}}
    with open_tenants(ram(tenants=rules), {"model": "keep"}) as pool:
        acme, globex = pool.chain("acme"), pool.chain("globex")
        acme.put(keys(range(3), b"acme"), [block(i) for i in range(3)])
        assert acme.keep(keys([0], b"acme")) == [True]
        flood(acme, range(10, 20), b"acme")  # acme beyond its own quota: its own evict
        flood(globex, range(100, 140), b"glob")
        assert exact(acme, range(3), b"acme") == [0]
        # globex has no budget
        assert globex.keep(keys([139], b"glob")) == [False]


def test_a_backend_without_the_hook_is_skipped() -> None:
    registry = BackendRegistry()
    registry.register("plain-keepless", PlainStore)
    config = {"chain": [{"name": "ram", "backend": "host", "capacity": "8KiB",
                         "tenants": {"*": {"keep": "4KiB"}}},
                        {"name": "plain", "backend": "plain-keepless"}]}
    with open_chain(config, {"model": "keep"}, registry=registry) as chain:
        chain.put(keys([1]), [block(1)])
        chain.flush()
        assert chain.keep(keys([1])) == [True]  # host kept it; plain keeps nothing
        assert chain.release(keys([1])) == [True]
        assert chain.tiers[1].handle.implements("kvtier_keep") is False
