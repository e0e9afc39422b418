"""The catalog's descriptors in a shared ``fs`` pool with tenants: the pool's own, no tenant's.

Every chain that opens a persistent tier records its namespace's descriptor
(model, dtype, tenant, ...) in the catalog namespace (``kvtier.chain.catalog``),
whatever its tenant.  Counted as a namespace of the tenant ``default`` (the
catalog's own namespace names no other), every tenant's chain opened on the
root took room from ``default``'s quota: here ``default``, filling its quota
exactly, lost a block of its own to the descriptors of the chains opened beside
it.  The descriptors are the pool's own (docs/tenants.md): in its capacity, in
no tenant's quota, and reported apart as ``catalog_bytes``, so that every byte
counted is someone's.
"""

from __future__ import annotations

import time
from pathlib import Path

from fs_blocks import files_on_disk

from kvtier.block.framing import Codec, encode
from kvtier.block.namespace import Namespace
from kvtier.chain.catalog import CATALOG_HEX
from kvtier.chain.tenants import open_tenants

MODEL = Namespace(model="llama-test")
QUOTA = 64 << 10
BLOCK = 8 << 10  # each block file, framed: 8 of them fill a quota


def framed(tenant: str, key: bytes, payload: bytes) -> int:
    return len(encode(MODEL.for_tenant(tenant).fingerprint, key, payload,
                      Codec(tenant=tenant.encode())))


def payload(tenant: str, key: bytes, seed: int) -> bytes:
    """A block of ``tenant``'s whose file, framed, takes BLOCK bytes."""
    size = BLOCK - (framed(tenant, key, bytes(4096)) - 4096)
    return bytes((seed * 31 + i) % 251 for i in range(size))


def test_descriptors_are_the_pool_s_own_not_the_default_tenant_s(tmp_path: Path) -> None:
    root = tmp_path / "kv"
    config = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{root}",
                         "capacity": "1MiB", "capacity_scope": "pool", "direct_io": False,
                         "tenants": {"*": {"quota": QUOTA}}}]}
    with open_tenants(config, MODEL) as tenants:
        # three chains, three descriptors: the default tenant's, acme's and globex's
        default, acme, globex = (tenants.chain(t) for t in (None, "acme", "globex"))
        assert len(files_on_disk(root, CATALOG_HEX)) == 3
        mine = [b"d%d" % i for i in range(8)]
        blocks = [payload("default", key, i) for i, key in enumerate(mine)]
        assert [framed("default", k, b) for k, b in zip(mine, blocks)] == [BLOCK] * 8
        assert default.put(mine, blocks) == [True] * 8  # its quota, to the byte
        theirs = [b"a%d" % i for i in range(3)]
        for seed, (tenant, chain) in enumerate({"acme": acme, "globex": globex}.items()):
            ours = [payload(tenant, k, 50 * seed + i) for i, k in enumerate(theirs)]
            assert chain.put(theirs, ours) == [True] * 3
        time.sleep(0.3)  # the flusher makes the rows of the puts within 50 ms
        # the default tenant lost nothing to the others' descriptors: byte for byte
        assert default.get_bytes(mine) == blocks
        figures = tenants.stats()["tenants"]
        backend = acme.stats()["tiers"][0]["backend_stats"]
        descriptors = sum(files_on_disk(root, CATALOG_HEX).values())
    assert figures["default"]["tiers"]["disk"]["used_bytes"] == 8 * BLOCK
    assert figures["default"]["tiers"]["disk"]["evictions"] == 0
    assert figures["acme"]["tiers"]["disk"]["used_bytes"] == 3 * BLOCK
    assert figures["globex"]["tiers"]["disk"]["used_bytes"] == 3 * BLOCK
    # the descriptors are counted, apart: every byte the pool counts is a tenant's or its own
    assert backend["catalog_bytes"] == descriptors > 0
    tenant_bytes = {k: v for k, v in backend.items() if k.startswith("tenant_bytes.")}
    assert tenant_bytes == {"tenant_bytes.default": 8 * BLOCK, "tenant_bytes.acme": 3 * BLOCK,
                            "tenant_bytes.globex": 3 * BLOCK}
    assert sum(tenant_bytes.values()) + backend["catalog_bytes"] == backend["pool_bytes"]
