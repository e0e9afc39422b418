"""Tenants' quotas and fair share in the ``fs`` tier's shared pool, on real files.

Each tenant is a namespace of its own (docs/tenants.md); here each is an ``fs`` backend
opened on its namespace with the ``tenant`` the chain would give it.  Across real
processes: tests/backends/fs/test_pool_tenants_noisy.py.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from fs_blocks import blob, files_on_disk, open_fs

from kvtier.backends.fs.pool import DB_NAME
from kvtier.block.framing import Codec, encode
from kvtier.chain.tenants import open_tenants
from kvtier.config import load_config
from kvtier.plugins.registry import BackendHandle
from kvtier.policies.tenancy import parse_tenants
from kvtier.spec import ConfigError

KiB = 1 << 10
SIZE = 8 * KiB
ACME, GLOBEX = "a" * 32, "b" * 32  # the tenants' namespaces


def tier(root: Path, handles: list[BackendHandle], ns: str, tenant: str | None,
         **over: Any) -> BackendHandle:
    """A tier of tenant ``tenant`` (None: the option unset) on a pool of the whole root."""
    opts: dict[str, Any] = {"capacity": 1 << 20, "capacity_scope": "pool", "direct_io": False,
                            **over}
    if tenant is not None:
        opts["tenant"] = tenant
    return open_fs(root, handles, ns, **opts)


def put_all(handle: BackendHandle, prefix: str, count: int, seed: int) -> list[bytes]:
    keys = [f"{prefix}{i}".encode() for i in range(count)]
    for i, key in enumerate(keys):
        assert handle.put([key], [blob(SIZE, seed + i)], []) == [True]
    return keys


def exact(handle: BackendHandle, keys: list[bytes], seed: int) -> list[bool]:
    """Per key: read back byte for byte (False: a miss; a wrong block fails the test)."""
    out = []
    for i, data in enumerate(handle.get(keys)):
        assert data is None or bytes(data) == blob(SIZE, seed + i), keys[i]
        out.append(data is not None)
    return out


def tenant_figures(handle: BackendHandle) -> dict[str, int]:
    time.sleep(0.2)  # the flusher records refusals and rows within 50 ms of the last put
    return {k: int(v) for k, v in handle.stats().items() if k.startswith("tenant_")}


def held_on_disk(root: Path, ns: str) -> int:
    return sum(files_on_disk(root, ns).values())


@pytest.mark.parametrize("eviction", ["lru", "s3fifo"])
def test_a_tenant_beyond_its_quota_evicts_only_its_own_blocks(tmp_path: Path, handles: list,
                                                                eviction: str) -> None:
    rules = {"acme": {"quota": 8 * SIZE}}
    globex = tier(tmp_path, handles, GLOBEX, "globex", tenants=rules, eviction=eviction)
    acme = tier(tmp_path, handles, ACME, "acme", tenants=rules, eviction=eviction)
    theirs = put_all(globex, "g", 6, seed=1000)
    mine = put_all(acme, "a", 30, seed=0)  # every put beyond the 8th evicts acme's oldest
    assert all(exact(globex, theirs, 1000))  # byte for byte, every one
    assert exact(acme, mine, 0) == [False] * 22 + [True] * 8  # its own, in the pool's order
    assert held_on_disk(tmp_path, ACME) == 8 * SIZE
    assert held_on_disk(tmp_path, GLOBEX) == 6 * SIZE
    figures = tenant_figures(acme)
    assert figures["tenant_bytes.acme"] <= 8 * SIZE
    assert figures["tenant_evicted.acme"] == 22
    assert "tenant_evicted.globex" not in figures


def test_a_block_larger_than_its_quota_is_refused_and_counted(tmp_path: Path,
                                                               handles: list) -> None:
    rules = {"*": {"quota": 4 * SIZE}}
    acme = tier(tmp_path, handles, ACME, "acme", tenants=rules)
    kept = put_all(acme, "a", 4, seed=0)
    assert acme.put([b"big"], [blob(4 * SIZE + 1)], []) == [False]
    assert all(exact(acme, kept, 0))  # nothing evicted for a block that cannot fit
    assert acme.stats()["refused_quota"] == 1
    assert tenant_figures(acme)["tenant_refused.acme"] == 1


def test_a_batch_beyond_its_quota_makes_way_for_itself(tmp_path: Path,
                                                       handles: list) -> None:
    """A batch beyond the quota, of blocks that each fit: the first make way for the
    later ones, as put one at a time; the other tenant loses nothing."""
    rules = {"*": {"quota": 3 * SIZE}}
    globex = tier(tmp_path, handles, GLOBEX, "globex", tenants=rules)
    acme = tier(tmp_path, handles, ACME, "acme", tenants=rules)
    theirs = put_all(globex, "g", 3, seed=1000)
    keys = [f"a{i}".encode() for i in range(5)]
    stored = acme.put(keys, [blob(SIZE, i) for i in range(5)], [])
    assert stored == [True] * 5  # two were stored and evicted at once ("pushed")
    assert sum(exact(acme, keys, 0)) == 3
    assert all(exact(globex, theirs, 1000))


@pytest.mark.parametrize("eviction", ["lru", "s3fifo"])
@pytest.mark.parametrize(("weights", "acme_share"), [((2, 1), 16), ((1, 1), 12)])
def test_a_full_pool_is_shared_by_weight(tmp_path: Path, handles: list, eviction: str,
                                         weights: tuple[int, int], acme_share: int) -> None:
    """Without quotas, tenants share a full pool by weight: acme alone fills it, then
    globex's puts take acme's blocks until each holds its share, then its own."""
    capacity = 24 * SIZE
    rules = {"acme": {"weight": weights[0]}, "globex": {"weight": weights[1]}}
    acme = tier(tmp_path, handles, ACME, "acme", tenants=rules, capacity=capacity,
                eviction=eviction)
    globex = tier(tmp_path, handles, GLOBEX, "globex", tenants=rules, capacity=capacity,
                  eviction=eviction)
    mine = put_all(acme, "a", 24, seed=0)
    theirs = put_all(globex, "g", 24, seed=1000)
    acme_kept = exact(acme, mine, 0)
    globex_kept = exact(globex, theirs, 1000)
    # each its share of the capacity, within the one block of room a put takes ahead
    assert abs(sum(acme_kept) - acme_share) <= 1, acme_kept
    assert abs(sum(globex_kept) - (24 - acme_share)) <= 1, globex_kept
    # in the pool's order: each kept its newest
    assert acme_kept == sorted(acme_kept) and globex_kept == sorted(globex_kept)


def test_a_noisy_tenant_cannot_push_a_quiet_one_below_its_share(tmp_path: Path,
                                                                handles: list) -> None:
    capacity = 24 * SIZE
    rules = {"*": {"weight": 1}}
    quiet = tier(tmp_path, handles, GLOBEX, "quiet", tenants=rules, capacity=capacity)
    noisy = tier(tmp_path, handles, ACME, "noisy", tenants=rules, capacity=capacity)
    theirs = put_all(quiet, "q", 12, seed=1000)  # its share: half the capacity
    put_all(noisy, "n", 120, seed=0)  # ten times its share
    assert all(exact(quiet, theirs, 1000))
    assert held_on_disk(tmp_path, ACME) <= 12 * SIZE


def test_processes_with_other_tenants_rules_are_refused(tmp_path: Path,
                                                        handles: list) -> None:
    tier(tmp_path, handles, ACME, "acme", tenants={"acme": "1MiB"})
    with pytest.raises(ConfigError) as err:
        tier(tmp_path, handles, GLOBEX, "globex", tenants={"acme": "2MiB"})
    # both rules named
    assert '{"acme":[1048576,1.0,0]}' in str(err.value)
    assert '{"acme":[2097152,1.0,0]}' in str(err.value)
    with pytest.raises(ConfigError):  # none is a rule too: it would not count quotas
        tier(tmp_path, handles, GLOBEX, "globex")
    tier(tmp_path, handles, GLOBEX, "globex", tenants={"acme": "1MiB"})  # the same: fine


def framed(ns: str, key: bytes, tenant: str, seed: int) -> bytes:
    """A block as a chain stores it: its header names the tenant."""
    return encode(bytes.fromhex(ns), key, blob(SIZE, seed), Codec(tenant=tenant.encode()))


def test_a_rebuilt_index_recovers_each_tenants_bytes(tmp_path: Path) -> None:
    rules = {"acme": {"quota": 40 * SIZE}, "globex": {"quota": 40 * SIZE}}
    first: list[BackendHandle] = []
    acme = tier(tmp_path, first, ACME, "acme", tenants=rules)
    globex = tier(tmp_path, first, GLOBEX, "globex", tenants=rules)
    for i in range(5):
        acme.put([b"a%d" % i], [framed(ACME, b"a%d" % i, "acme", i)], [])
    for i in range(3):
        globex.put([b"g%d" % i], [framed(GLOBEX, b"g%d" % i, "globex", i)], [])
    before = tenant_figures(globex)
    for handle in first:
        handle.close()
    for name in os.listdir(tmp_path):
        if name.startswith(DB_NAME):
            os.remove(tmp_path / name)
    # reopened without the tenant option, as kvtier inspect or an older opener would:
    # each namespace's tenant comes from its blocks' headers
    again: list[BackendHandle] = []
    try:
        tier(tmp_path, again, ACME, None, tenants=rules)
        reopened = tier(tmp_path, again, GLOBEX, None, tenants=rules)
        after = tenant_figures(reopened)
    finally:
        for handle in again:
            handle.close()
    sizes = {t: before[f"tenant_bytes.{t}"] for t in ("acme", "globex")}
    assert sizes == {"acme": 5 * len(framed(ACME, b"a0", "acme", 0)),
                     "globex": 3 * len(framed(GLOBEX, b"g0", "globex", 0))}
    assert {t: after[f"tenant_bytes.{t}"] for t in sizes} == sizes
    assert "tenant_bytes.default" not in after


def test_without_the_pool_the_bound_is_the_least_of_capacity_and_quota(
        tmp_path: Path, handles: list) -> None:
    """``capacity_scope: process`` (a remote root is the same): each instance is one
    tenant's; cross-tenant fair share needs the pool (docs/tenants.md)."""
    rules = {"acme": {"quota": 4 * SIZE}}
    acme = tier(tmp_path, handles, ACME, "acme", tenants=rules, capacity_scope="process")
    globex = tier(tmp_path, handles, GLOBEX, "globex", tenants=rules,
                  capacity_scope="process", capacity=6 * SIZE)
    assert acme.capabilities().capacity == 4 * SIZE
    assert globex.capabilities().capacity == 6 * SIZE
    mine = put_all(acme, "a", 10, seed=0)
    assert exact(acme, mine, 0) == [False] * 6 + [True] * 4


def test_the_documented_example_opens_a_pool_with_its_tenants(tmp_path: Path,
                                                              handles: list) -> None:
    """docs/tenants.md's ``fs`` example, loaded as a file and opened on a local root."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "tenants.md").read_text()
    section = doc[doc.index("### On `fs` (available)"):]
    example = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert example is not None
    path = tmp_path / "tiers.yaml"
    path.write_text(example[1].replace("file:///mnt/nvme/kv", f"file://{tmp_path / 'kv'}"))
    (disk,) = load_config(path).tiers
    rules = parse_tenants(disk.options["tenants"])
    assert rules.quota("acme") == 200 << 30 and rules.quota("initech") == 50 << 30
    assert rules.quota("globex") is None and rules.rule("globex").weight == 2
    acme = open_fs(tmp_path / "kv", handles, ACME, capacity=disk.options["capacity"],
                   capacity_scope=disk.options["capacity_scope"],
                   tenants=disk.options["tenants"], tenant="acme")
    assert acme.put([b"k"], [blob(SIZE)], []) == [True]
    assert tenant_figures(acme)["tenant_bytes.acme"] == SIZE


def test_through_the_chain_each_tenant_is_counted_by_its_namespace(tmp_path: Path) -> None:
    """open_tenants hands each tenant's fs instance its tenant (the chain's ``tenant``
    option): acme's quota holds, globex's blocks read back exact."""
    model = {"model": "tenant-test", "dtype": "bfloat16", "tokens_per_block": 16}
    size = 64 * KiB
    tier = {"name": "disk", "backend": "fs", "url": str(tmp_path), "fsync": False,
            "capacity": "64MiB", "capacity_scope": "pool",
            "tenants": {"acme": {"quota": "1MiB"}}}
    keys = [bytes([i]) * 16 for i in range(1, 41)]
    with open_tenants({"chain": [tier]}, model) as tenants:
        acme, globex = tenants.chain("acme"), tenants.chain("globex")
        assert all(globex.put(keys[:4], [blob(size, i) for i in range(4)]))
        for i, key in enumerate(keys):  # 40 blocks: 2.5 times acme's quota
            assert acme.put([key], [blob(size, 100 + i)]) == [True]
        acme.flush(), globex.flush()
        outs = [bytearray(size) for _ in keys]
        found = globex.get(keys[:4], outs[:4])
        assert all(found) and [bytes(o) for o in outs[:4]] == [blob(size, i) for i in range(4)]
        found = acme.get(keys, outs)
        kept = [i for i, f in enumerate(found) if f]
        assert kept == list(range(40 - len(kept), 40))  # its newest, in the pool's order
        assert all(bytes(outs[i]) == blob(size, 100 + i) for i in kept)
        time.sleep(0.2)  # the flusher's rows
        (disk,) = acme.stats()["tiers"]
        figures = disk["backend_stats"]
        assert figures["tenant_bytes.acme"] <= 1 << 20 < figures["tenant_bytes.acme"] + size + 4096
        assert figures["tenant_evicted.acme"] == 40 - len(kept)
        assert "tenant_evicted.globex" not in figures


def test_a_quota_alone_counts_every_tenant_in_the_pool(tmp_path: Path, handles: list) -> None:
    """No capacity: a quota in ``tenants`` opens the pool, for the tenants without one too."""
    rules = {"acme": {"quota": 4 * SIZE}}
    acme = tier(tmp_path, handles, ACME, "acme", tenants=rules, capacity=None)
    globex = tier(tmp_path, handles, GLOBEX, "globex", tenants=rules, capacity=None)
    put_all(globex, "g", 6, seed=1000)
    mine = put_all(acme, "a", 10, seed=0)
    assert exact(acme, mine, 0) == [False] * 6 + [True] * 4
    figures = tenant_figures(globex)
    assert figures["tenant_bytes.acme"] == 4 * SIZE
    assert figures["tenant_bytes.globex"] >= 6 * SIZE  # its credit counted with its files
    assert held_on_disk(tmp_path, GLOBEX) == 6 * SIZE
