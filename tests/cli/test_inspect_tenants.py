"""``kvtier inspect`` per tenant, on a real fs root holding two tenants' blocks.

The tenant of each namespace is what its blocks' headers name; the figures
are checked against sizes computed with the block format, apart from the
backend.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

import kvtier
from kvtier.block import framing
from kvtier.block.framing import Codec
from kvtier.chain.catalog import CATALOG_HEX
from kvtier.chain.tenants import open_tenants
from kvtier.cli import cli

LLAMA = kvtier.Namespace(model="llama-test", dtype="bfloat16", tokens_per_block=32)
QWEN = kvtier.Namespace(model="qwen-test", dtype="float16", tokens_per_block=16)
#: Blocks each (model, tenant) writes.
WRITES = [(LLAMA, "acme", 5), (LLAMA, "globex", 3), (QWEN, "acme", 2)]


def payloads(ns: kvtier.Namespace, tenant: str, count: int) -> dict[bytes, bytes]:
    rng = __import__("random").Random(f"{ns.model}/{tenant}")
    return {b"k%03d" % i: rng.randbytes(2000 + 131 * i) for i in range(count)}


def stored_size(ns: kvtier.Namespace, key: bytes, payload: bytes) -> int:
    return len(framing.encode(ns.fingerprint, key, payload, Codec(tenant=ns.tenant.encode())))


def fill(tmp_path: Path) -> tuple[str, dict[str, tuple[int, int]]]:
    """The chain file, and each tenant's (blocks, bytes) as the format computes them."""
    config = tmp_path / "chain.yaml"
    config.write_text(yaml.safe_dump({"chain": [
        {"name": "ram", "backend": "host", "capacity": "4MiB"},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/kv"}]}))
    expected: dict[str, tuple[int, int]] = {}
    for model, tenant, count in WRITES:
        data = payloads(model, tenant, count)
        with open_tenants(str(config), model) as tenants:
            chain = tenants.chain(tenant)
            assert chain.put(list(data), list(data.values())) == [True] * count
            ns = chain.namespace
        blocks, size = expected.get(tenant, (0, 0))
        expected[tenant] = (blocks + count,
                            size + sum(stored_size(ns, k, p) for k, p in data.items()))
    return str(config), expected


def inspect(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["inspect", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (disk,) = [t for t in json.loads(result.stdout)["tiers"] if t["tier"] == "disk"]
    found: dict[str, Any] = disk
    return found


def test_inspect_gives_each_tenant_s_blocks_and_bytes(tmp_path: Path) -> None:
    config, expected = fill(tmp_path)
    disk = inspect(config)
    assert [(t["tenant"], t["blocks"], t["bytes"]) for t in disk["tenants"]] == [
        ("acme", *expected["acme"]), ("globex", *expected["globex"])]  # most bytes first
    assert [t["namespaces"] for t in disk["tenants"]] == [2, 1]
    tenant_of = {ns["namespace"]: ns["tenant"] for ns in disk["namespaces"]}
    assert tenant_of == {LLAMA.for_tenant("acme").hex: "acme",
                         LLAMA.for_tenant("globex").hex: "globex",
                         QWEN.for_tenant("acme").hex: "acme"}

    only = inspect(config, "--tenant", "globex")
    assert [(t["tenant"], t["blocks"], t["bytes"]) for t in only["tenants"]] == [
        ("globex", *expected["globex"])]
    assert [ns["namespace"] for ns in only["namespaces"]] == [LLAMA.for_tenant("globex").hex]
    assert inspect(config, "--tenant", "nobody")["tenants"] == []

    table = CliRunner().invoke(cli, ["inspect", config, "--tier", "disk"])
    assert table.exit_code == 0, table.output
    assert "per tenant" in table.stdout and "globex" in table.stdout


def test_the_tenant_is_read_from_the_block_headers(tmp_path: Path) -> None:
    """Without the catalog's descriptors, the headers still name each tenant; reading no
    header (--sample 0) then leaves it unknown rather than guessed."""
    config, expected = fill(tmp_path)
    catalogs = [p for p in (tmp_path / "kv").rglob(f"*{CATALOG_HEX}*") if p.is_dir()]
    assert catalogs, sorted(str(p) for p in (tmp_path / "kv").iterdir())
    for path in catalogs:
        shutil.rmtree(path)
    disk = inspect(config)
    assert disk["descriptors"] == 0
    assert [(t["tenant"], t["blocks"], t["bytes"]) for t in disk["tenants"]] == [
        ("acme", *expected["acme"]), ("globex", *expected["globex"])]
    blind = inspect(config, "--sample", "0")
    assert [(t["tenant"], t["blocks"]) for t in blind["tenants"]] == [(None, 10)]
