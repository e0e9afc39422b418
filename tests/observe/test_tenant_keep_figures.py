"""Kept bytes and refused keep marks, per tenant: ``Tenants.stats()`` and the Prometheus endpoint.

A real ``fs`` shared pool (with a ``host`` tier above it) and two processes:
the child, tenant globex, marks more blocks than its keep budget holds; this
process, tenant acme, too.  The pool counts each tenant's refused marks in its
index, for every process, so globex's figures reach this process though it
never opened globex; the ``host`` tier, the process's own, gives acme's from
acme's chain.  Kept bytes are checked against the framed sizes of the blocks
kept (the block format, apart from the backend).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml
from tenant_figures import MODEL, framed, free_port

from kvtier.chain.tenants import open_tenants

BLOCK = 7000  # payload bytes: a budget of 16 KiB keeps 2 of them, framed
CHILD = """
import sys
from kvtier.chain.tenants import open_tenants
with open_tenants(sys.argv[1], "llama-test") as tenants:
    chain = tenants.chain("globex")
    keys = [b"g%d" % i for i in range(3)]
    assert chain.put(keys, [bytes([i]) * 7000 for i in range(3)]) == [True] * 3
    assert chain.keep(keys) == [True, True, False]  # the third is beyond the budget
"""


def test_kept_bytes_and_refused_marks_are_per_tenant(tmp_path: Path) -> None:
    port = free_port()
    rules = {"*": {"quota": "256KiB", "keep": "16KiB"}}
    config = tmp_path / "chain.yaml"
    config.write_text(yaml.safe_dump({
        "chain": [{"name": "ram", "backend": "host", "capacity": "1MiB", "tenants": rules},
                  {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/kv",
                   "capacity": "1MiB", "capacity_scope": "pool", "direct_io": False,
                   "write": "through", "tenants": rules}],
        "metrics": {"prometheus_port": port, "tenants_top": 1}}))
    subprocess.run([sys.executable, "-c", CHILD, str(config)], check=True, timeout=120)

    keys = [b"a%d" % i for i in range(5)]
    blocks = [bytes([50 + i]) * BLOCK for i in range(5)]
    with open_tenants(str(config), MODEL) as tenants:
        acme = tenants.chain("acme")
        assert acme.put(keys, blocks) == [True] * 5
        acme.flush()
        assert acme.keep(keys) == [True, True, False, False, False]
        time.sleep(0.2)
        figures = tenants.stats()["tenants"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    disk, ram = figures["acme"]["tiers"]["disk"], figures["acme"]["tiers"]["ram"]
    # the pool: every process's marks, per tenant, from its index
    assert (disk["kept_bytes"], disk["keep_refused"]) == (
        framed("acme", keys[0], blocks[0]) + framed("acme", keys[1], blocks[1]), 3)
    assert {"kept_bytes", "keep_refused"} <= set(disk["reported"])
    globex = figures["globex"]
    assert globex["open"] is False
    assert (globex["tiers"]["disk"]["kept_bytes"], globex["tiers"]["disk"]["keep_refused"]) == (
        sum(framed("globex", b"g%d" % i, bytes([i]) * BLOCK) for i in range(2)), 1)
    # the host tier (it holds framed blocks too): acme's chain's own, globex's nothing here
    assert (ram["kept_bytes"], ram["keep_refused"]) == (disk["kept_bytes"], 3)
    assert (globex["tiers"]["ram"]["kept_bytes"], globex["tiers"]["ram"]["keep_refused"]) == (
        0, 0)
    # on the endpoint: acme is the top tenant, globex counted in 'other'
    body = text.decode()
    namespace = MODEL.for_tenant(None).hex

    def sample(metric: str, tenant: str, tier: str) -> float:
        labels = f'namespace="{namespace}",tenant="{tenant}",tier="{tier}"'
        (value,) = re.findall(rf"^{metric}\{{{re.escape(labels)}\}} (\S+)$", body, re.M)
        return float(value)

    assert sample("kvtier_tenant_kept_bytes", "acme", "disk") == disk["kept_bytes"]
    assert sample("kvtier_tenant_keep_refused_blocks_total", "acme", "disk") == 3.0
    assert sample("kvtier_tenant_keep_refused_blocks_total", "other", "disk") == 1.0
    assert sample("kvtier_tenant_kept_bytes", "other", "disk") == (
        globex["tiers"]["disk"]["kept_bytes"])
