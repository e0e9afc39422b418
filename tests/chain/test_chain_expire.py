"""Deadlines through the chain (``Chain.expire``): a block past its deadline is a miss at
every tier that held it, never later than the tier's own ``expire``; per-key answers; a
tier that holds the block without ``kvtier_expire`` makes the answer False."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from plain_store import PlainStore

from kvtier import open_chain
from kvtier.chain import Chain
from kvtier.chain.tenants import open_tenants
from kvtier.plugins.registry import BackendRegistry

BLOCK = 1000


def block(i: int) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(BLOCK))


def keys(ids: Sequence[int], tag: bytes = b"due") -> list[bytes]:
    return [tag + i.to_bytes(4, "big") for i in ids]


def exact(chain: Chain, ids: Sequence[int], tag: bytes = b"due") -> list[int]:
    """The ids read back; a wrong byte fails the test."""
    out = []
    for i, data in zip(ids, chain.get_bytes(keys(ids, tag)), strict=True):
        if data is not None:
            assert data == block(i), i
            out.append(i)
    return out


def wait_until(start: float, seconds: float) -> None:
    time.sleep(max(0.0, start + seconds - time.monotonic()))


def ram(**more: object) -> dict[str, object]:
    return {"chain": [{"name": "ram", "backend": "host", "capacity": "64KiB", **more}]}


def test_a_block_past_its_deadline_is_a_miss_and_counted() -> None:
    with open_chain(ram(), {"model": "expire"}) as chain:
        chain.put(keys(range(4)), [block(i) for i in range(4)])
        before = time.monotonic()
        assert chain.expire(keys([1, 3, 9]), after=0.4) == [True, True, False]
        start = time.monotonic()  # the deadline is no later than start + after
        if start - before < 0.3:  # before the deadline: exact
            assert exact(chain, range(4)) == [0, 1, 2, 3]
        wait_until(start, 0.45)
        assert exact(chain, range(4)) == [0, 2]
        assert chain.lookup(keys([1, 3])) == [None, None]
        tier = chain.stats()["tiers"][0]["backend_stats"]
        assert tier["expired"] == 2 and tier["tenant_expired.default"] == 2


def test_a_duration_string_and_bad_deadlines() -> None:
    with open_chain(ram(), {"model": "expire"}) as chain:
        chain.put(keys([0]), [block(0)])
        assert chain.expire(keys([0]), after="1h") == [True]
        for bad in (0, -1, "soon", float("nan")):
            with pytest.raises(ValueError):
                chain.expire(keys([0]), after=bad)  # type: ignore[arg-type]
        assert exact(chain, [0]) == [0]


def test_never_later_than_the_tier_s_expire_and_the_earlier_deadline_holds() -> None:
    with open_chain(ram(expire="0.5s"), {"model": "expire"}) as chain:
        chain.put(keys(range(3)), [block(i) for i in range(3)])
        assert chain.expire(keys([0]), after=0.25) == [True]
        start = time.monotonic()  # the deadline is no later than start + after
        assert chain.expire(keys([0]), after=3600) == [True]  # the earlier stays
        assert chain.expire(keys([1]), after=3600) == [True]  # the tier's expire still holds
        wait_until(start, 0.3)
        assert exact(chain, range(3)) == [1, 2]
        wait_until(start, 0.6)
        assert exact(chain, range(3)) == []


def test_a_kept_block_still_expires_at_its_deadline() -> None:
    with open_chain(ram(tenants={"*": {"keep": "8KiB"}}), {"model": "expire"}) as chain:
        chain.put(keys(range(2)), [block(i) for i in range(2)])
        assert chain.keep(keys(range(2))) == [True, True]
        assert chain.expire(keys([0]), after=0.3) == [True]
        start = time.monotonic()  # the deadline is no later than start + after
        wait_until(start, 0.35)
        assert exact(chain, range(2)) == [1]


def test_every_tier_that_holds_the_block_drops_it(tmp_path: Path) -> None:
    config = {"chain": [
        {"name": "ram", "backend": "host", "capacity": "64KiB"},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}", "capacity": "1MiB",
         "direct_io": False, "write": "through"}]}
    with open_chain(config, {"model": "expire"}) as chain:
        chain.put(keys(range(3)), [block(i) for i in range(3)])
        assert chain.expire(keys([0, 2]), after=0.4) == [True, True]
        start = time.monotonic()  # the deadline is no later than start + after
        for tier in chain.tiers:
            assert tier.lookup(keys(range(3))) == [True, True, True], tier.name
        wait_until(start, 0.45)
        assert exact(chain, range(3)) == [1]  # not read back from the tier below
        for tier in chain.tiers:
            assert tier.lookup(keys([0, 2])) == [False, False], tier.name


def test_each_tenant_s_chain_expires_its_own_blocks() -> None:
    with open_tenants(ram(), {"model": "expire"}) as pool:
        acme, globex = pool.chain("acme"), pool.chain("globex")
        acme.put(keys([0], b"same"), [block(0)])
        globex.put(keys([0], b"same"), [block(1)])
        assert acme.expire(keys([0], b"same"), after=0.3) == [True]
        start = time.monotonic()  # the deadline is no later than start + after
        wait_until(start, 0.35)
        assert acme.get_bytes(keys([0], b"same")) == [None]
        assert globex.get_bytes(keys([0], b"same")) == [block(1)]


def test_a_tier_that_holds_the_block_without_the_hook_makes_it_false() -> None:
    registry = BackendRegistry()
    registry.register("plain-deadlineless", PlainStore)
    config = {"chain": [{"name": "ram", "backend": "host", "capacity": "8KiB"},
                        {"name": "plain", "backend": "plain-deadlineless",
                         "write": "through"}]}
    with open_chain(config, {"model": "expire"}, registry=registry) as chain:
        chain.put(keys([1]), [block(1)])
        chain.tiers[0].handle.put(keys([2]), [block(2)], [])  # held by the host tier alone
        # the plain tier would keep 1 past the deadline: False; 2 is held where it holds
        assert chain.expire(keys([1, 2]), after=3600) == [False, True]
        assert chain.tiers[1].handle.implements("kvtier_expire") is False
