"""``kvtier inspect --tenant``: each tenant's kept bytes and refused keep marks, on a real fs pool.

Two tenants mark blocks kept beyond their keep budget on a shared ``fs`` pool
with ``tenants``; inspect reads the pool's per-tenant figures (every process's,
from its index) beside each tenant's blocks and bytes.  Kept bytes are checked
against the framed sizes of the blocks kept, computed with the block format.
A tier that counts no tenants says so (``null``, ``-``) rather than 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from kvtier.block import framing
from kvtier.block.framing import Codec
from kvtier.block.namespace import Namespace
from kvtier.chain.tenants import open_tenants
from kvtier.cli import cli

MODEL = Namespace(model="llama-test")
BLOCK = 7000  # a keep budget of 16 KiB holds 2 of them, framed


def framed(tenant: str, key: bytes, payload: bytes) -> int:
    ns = MODEL.for_tenant(tenant)
    return len(framing.encode(ns.fingerprint, key, payload, Codec(tenant=tenant.encode())))


def tiers(config: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["inspect", str(config), *args, "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return {t["tier"]: t for t in json.loads(result.stdout)["tiers"]}


def test_inspect_gives_each_tenant_s_kept_bytes_and_refused_marks(tmp_path: Path) -> None:
    rules = {"*": {"quota": "256KiB", "keep": "16KiB"}}
    config = tmp_path / "chain.yaml"
    config.write_text(yaml.safe_dump({"chain": [
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/kv", "capacity": "1MiB",
         "capacity_scope": "pool", "direct_io": False, "tenants": rules},
        {"name": "plain", "backend": "fs", "url": f"file://{tmp_path}/plain",
         "direct_io": False, "write": "through"}]}))
    marks = {"acme": 5, "globex": 2}  # blocks each marks: acme 3 beyond its budget
    kept: dict[str, int] = {}
    with open_tenants(str(config), MODEL) as tenants:
        for tenant, count in marks.items():
            keys = [b"%s%d" % (tenant.encode(), i) for i in range(count)]
            blocks = [bytes([i]) * BLOCK for i in range(count)]
            chain = tenants.chain(tenant)
            assert chain.put(keys, blocks) == [True] * count
            chain.flush()
            assert chain.keep(keys)[:2] == [True, True]
            kept[tenant] = sum(framed(tenant, k, b) for k, b in zip(keys[:2], blocks[:2]))
    before = sorted((str(p), p.stat().st_mtime_ns) for p in (tmp_path / "kv").rglob("*"))
    found = tiers(config)
    # a look: the pool's index read as it is, nothing written under the root
    assert sorted((str(p), p.stat().st_mtime_ns) for p in (tmp_path / "kv").rglob("*")) == before
    rows = {t["tenant"]: t for t in found["disk"]["tenants"]}
    assert {name: (row["kept_bytes"], row["keep_refused"]) for name, row in rows.items()} == {
        "acme": (kept["acme"], 3), "globex": (kept["globex"], 0)}
    # a tier without tenants counts no marks per tenant: unknown, not 0
    assert [(t["kept_bytes"], t["keep_refused"]) for t in found["plain"]["tenants"]] == [
        (None, None), (None, None)]

    only = tiers(config, "--tier", "disk", "--tenant", "acme")["disk"]["tenants"]
    assert [(t["tenant"], t["kept_bytes"], t["keep_refused"]) for t in only] == [
        ("acme", kept["acme"], 3)]
    table = CliRunner().invoke(cli, ["inspect", str(config), "--tier", "disk", "--tenant",
                                     "acme"])
    assert table.exit_code == 0, table.output
    assert "keep refused" in table.stdout
