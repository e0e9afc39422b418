"""Per-tenant figures of a real ``fs`` pool shared by two processes.

Another process writes tenant globex's blocks; this process opens only acme.
The pool reports every tenant of the root, so Tenants.stats() and the
Prometheus endpoint give globex's bytes too, exactly the framed size of what
it wrote (computed with the block format, apart from the backend).
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml
from tenant_figures import MODEL, framed, free_port

from kvtier.chain.tenants import open_tenants

CHILD = """
import sys
from kvtier.chain.tenants import open_tenants
with open_tenants(sys.argv[1], "llama-test") as tenants:
    keys = [b"g%d" % i for i in range(3)]
    assert tenants.chain("globex").put(keys, [bytes([i]) * 5000 for i in range(3)]) == [True] * 3
"""


def test_a_pool_reports_the_tenants_of_other_processes(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "chain.yaml"
    config.write_text(yaml.safe_dump({
        "chain": [{"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/kv",
                   "capacity": "1MiB", "capacity_scope": "pool", "direct_io": False,
                   "tenants": {"*": {"quota": "64KiB"}}}],
        "metrics": {"prometheus_port": port, "tenants_top": 1}}))
    subprocess.run([sys.executable, "-c", CHILD, str(config)], check=True, timeout=120)
    globex = sum(framed("globex", b"g%d" % i, bytes([i]) * 5000) for i in range(3))

    with open_tenants(str(config), MODEL) as tenants:
        keys = [b"a%02d" % i for i in range(20)]  # 20 x 8000 bytes against a 64 KiB quota
        assert tenants.chain("acme").put(keys, [bytes([i]) * 8000 for i in range(20)]) == (
            [True] * 20)
        stats = tenants.stats()["tenants"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    assert stats["globex"]["open"] is False
    assert stats["globex"]["tiers"]["disk"]["used_bytes"] == globex
    assert (stats["globex"]["tiers"]["disk"]["hits"], stats["globex"]["tiers"]["disk"]["misses"]
            ) == (0, 0)
    # acme's quota keeps 8 of its 20 blocks: the other 12 were its own, evicted
    one = framed("acme", keys[0], bytes(8000))
    assert 8 * one <= 64 << 10 < 9 * one
    acme = stats["acme"]["tiers"]["disk"]
    assert (acme["used_bytes"], acme["evictions"], acme["refused"]) == (8 * one, 12, 0)
    assert "used_bytes" in acme["reported"]
    # no other tenant: the catalog's descriptors are the pool's own, not the default tenant's
    assert sorted(stats) == ["acme", "globex"]
    # on the endpoint: acme holds the most; globex is 'other'
    namespace = MODEL.for_tenant(None).hex
    body = text.decode()
    assert (f'kvtier_tenant_used_bytes{{namespace="{namespace}",tenant="acme",tier="disk"}} '
            f'{float(8 * one)}') in body
    other = sum(t["used_bytes"] for name, t in stats.items() if name != "acme")
    assert other == globex
    assert (f'kvtier_tenant_used_bytes{{namespace="{namespace}",tenant="other",tier="disk"}} '
            f'{float(other)}') in body
    assert 'tenant="globex"' not in body
