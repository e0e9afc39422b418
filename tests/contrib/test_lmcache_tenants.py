"""Tenants through the LMCache 0.5.6 adapter: a tenant per salt, a salt mapping, a shared tenant.

Adapters are built by LMCache's own ``--l2-adapter`` parsing and factory,
buffers are LMCache's L1 memory objects (``lmcache_driver``), the tiers real
(host RAM and fs).  LMCache's chunk hash leaves the salt out, so the same
prompt has the same chunk hashes under every salt: the keys below differ in
their salt only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

lmcache = pytest.importorskip(
    "lmcache.v1.distributed.l2_adapters",
    reason="lmcache is not installed (make venv installs lmcache==0.5.6)",
)

from lmcache_driver import build, fetch, fill, host_fs, objects, okey, store  # noqa: E402

from kvtier.chain.catalog import CATALOG_HEX  # noqa: E402
from kvtier.contrib.lmcache.tenancy import tenant_of_salt  # noqa: E402

LONG_MODEL = "org/" + "m" * 70  # a key over 64 bytes: digested, the salt unreadable in it


def fs_blocks(tmp_path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in (tmp_path / "fs").rglob("*.kvb"):
        if CATALOG_HEX not in path.parts:
            name = path.relative_to(tmp_path / "fs").parts[0]
            counts[name] = counts.get(name, 0) + 1
    return counts


def namespaces(adapter: Any) -> dict[str, str]:
    tenancy = adapter._tenancy
    return {t: tenancy.chain_of(t).namespace.hex for t in tenancy.opened()}


@pytest.mark.parametrize("model", ["tiny", LONG_MODEL])
def test_a_tenant_per_salt_keeps_the_same_chunks_apart(
    tmp_path: Path, adapter_of: Any, l1: Any, model: str
) -> None:
    adapter = adapter_of(host_fs(tmp_path), tenants="salt")
    acme = [okey(i, salt="acme", model=model) for i in range(4)]
    globex = [okey(i, salt="globex", model=model) for i in range(4)]
    objs = objects(l1, 4)
    acme_data = fill(objs, seed=1)
    assert store(adapter, acme, objs).is_successful()
    globex_data = fill(objs, seed=2)
    assert store(adapter, globex, objs).is_successful()
    assert fetch(adapter, l1, acme) == acme_data
    assert fetch(adapter, l1, globex) == globex_data
    assert fetch(adapter, l1, [okey(i, salt="initech", model=model) for i in range(4)]) == [
        None] * 4
    adapter._tenancy.chain_of("acme").flush()
    adapter._tenancy.chain_of("globex").flush()
    names = namespaces(adapter)
    # the tenant is a field of its own: each tenant's blocks in its own namespace on disk
    assert fs_blocks(tmp_path) == {names["acme"]: 4, names["globex"]: 4}
    assert "default" in names and "initech" in names and len(set(names.values())) == 4


def test_a_salt_that_is_no_tenant_name_gets_one(tmp_path: Path, adapter_of: Any,
                                                l1: Any) -> None:
    adapter = adapter_of(host_fs(tmp_path), tenants="salt")
    keys = [okey(i, salt="user 42+x") for i in range(2)]
    objs = objects(l1, 2)
    data = fill(objs, seed=3)
    store(adapter, keys, objs)
    assert fetch(adapter, l1, keys) == data
    name = tenant_of_salt("user 42+x")
    assert name.startswith("salt-") and name in adapter._tenancy.opened()
    assert tenant_of_salt("acme") == "acme"


def test_a_mapping_and_a_shared_system_prompt(tmp_path: Path, adapter_of: Any, l1: Any) -> None:
    adapter = adapter_of(host_fs(tmp_path), tenants={"s-acme": "acme", "s-globex": "globex",
                                                      "s-sys": "public"},
                         shared_tenants=["public"])
    system = list(range(3))  # the system prompt's chunks: the same hashes for every salt
    objs = objects(l1, 3)
    prompt = fill(objs, seed=4)
    assert store(adapter, [okey(i, salt="s-sys") for i in system], objs).is_successful()
    # each tenant reads the shared system prompt, exact, under its own salt
    for salt in ("s-acme", "s-globex", ""):
        assert fetch(adapter, l1, [okey(i, salt=salt) for i in system]) == prompt
    # what a tenant stores after it stays its own
    mine = objects(l1, 1)
    private = fill(mine, seed=5)
    store(adapter, [okey(9, salt="s-acme")], mine)
    assert fetch(adapter, l1, [okey(9, salt="s-acme")]) == private
    assert fetch(adapter, l1, [okey(9, salt="s-globex")]) == [None]
    assert fetch(adapter, l1, [okey(9, salt="s-sys")]) == [None]
    # a tenant's delete removes only its own blocks, never a shared one
    adapter.delete([okey(0, salt="s-acme")])
    assert fetch(adapter, l1, [okey(0, salt="s-globex")]) == prompt[:1]
    names = namespaces(adapter)
    for tenant in ("acme", "globex", "default"):
        adapter._tenancy.chain_of(tenant).flush()
    assert fs_blocks(tmp_path) == {names["default"]: 3, names["acme"]: 1}


def test_without_a_shared_tenant_no_read_leaves_the_tenant(tmp_path: Path, adapter_of: Any,
                                                          l1: Any) -> None:
    adapter = adapter_of(host_fs(tmp_path), tenants={"s-acme": "acme"})
    objs = objects(l1, 2)
    fill(objs, seed=6)
    store(adapter, [okey(i) for i in range(2)], objs)  # no salt: the default tenant's
    assert fetch(adapter, l1, [okey(i, salt="s-acme") for i in range(2)]) == [None, None]


@pytest.mark.parametrize("params,match", [
    ({"tenants": "per-salt"}, "tenants"), ({"tenants": {"s": "no/slash"}}, "tenants"),
    ({"tenants": "salt", "shared_tenants": ["a b"]}, "shared_tenants"),
    ({"shared_tenants": ["public"]}, "needs adapter_params.tenants"),
])
def test_bad_tenant_params_stop_lmcache(tmp_path: Path, params: dict[str, Any],
                                        match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build({"kvtier_config": host_fs(tmp_path), **params})
