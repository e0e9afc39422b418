"""Two SGLang engine processes of different configured tenants on one fs pool.

SGLang's storage calls carry no request, so a tenant is a setting of the
engine process (the extra config's ``tenant``).  Each process here builds the
backend as SGLang's cache controller does, in SGLang's own host pool
(``tests/support/sglang_tenant_child.py``), and both store *the same page
hashes* (the same prompt) with different bytes.  Each tenant then reads back
exactly its own pages, byte for byte; a third tenant finds none; on disk each
tenant's namespace directory holds its own blocks.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang 0.5.23 is not installed (make venv installs it)", allow_module_level=True)

import yaml

from kvtier.chain.catalog import CATALOG_HEX

CHILD = Path(__file__).parents[1] / "support" / "sglang_tenant_child.py"


def engine(chain_yaml: Path, tenant: str, mode: str, seed: int = 0) -> dict[str, Any]:
    spec = {"yaml": str(chain_yaml), "tenant": tenant, "mode": mode, "seed": seed}
    done = subprocess.run([sys.executable, str(CHILD), json.dumps(spec)], capture_output=True,
                          text=True, timeout=300, cwd=CHILD.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.timeout(600)
def test_engines_of_two_tenants_on_one_pool_see_only_their_own_pages(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    chain_yaml = tmp_path / "tiers.yaml"
    chain_yaml.write_text(yaml.safe_dump({"chain": [
        {"name": "ram", "backend": "host", "capacity": "64MiB"},
        {"name": "disk", "backend": "fs", "url": str(root)}]}))
    with ThreadPoolExecutor(2) as pool:  # two engine processes at once
        acme_w, globex_w = pool.map(lambda a: engine(chain_yaml, *a),
                                    [("acme", "write", 1), ("globex", "write", 2)])
    assert acme_w["saved"] and globex_w["saved"]
    assert acme_w["pages"] != globex_w["pages"]  # the same hashes, other bytes
    assert acme_w["namespace"] != globex_w["namespace"]
    for tenant, wrote in (("acme", acme_w), ("globex", globex_w)):
        read = engine(chain_yaml, tenant, "read")
        assert (read["tenant"], read["namespace"]) == (tenant, wrote["namespace"])
        assert read["exists"] == read["loaded"] == 4
        assert read["pages"] == wrote["pages"]  # its own bytes, not the other's
    stranger = engine(chain_yaml, "default", "read")
    assert stranger["exists"] == stranger["loaded"] == 0
    # nothing was loaded into its pool: its pages are all alike (zeros)
    assert len(set(stranger["pages"])) == 1
    blocks: dict[str, int] = {}
    for path in root.rglob("*.kvb"):
        if CATALOG_HEX not in path.parts:
            name = path.relative_to(root).parts[0]
            blocks[name] = blocks.get(name, 0) + 1
    # page_first, v1: two blocks per page (K, V); each tenant's in its own namespace only
    assert blocks == {acme_w["namespace"]: 8, globex_w["namespace"]: 8}


def test_a_bad_tenant_stops_the_engine_at_start_up(tmp_path: Path) -> None:
    from kvtier.contrib.sglang import extra_config, sglang_args
    from kvtier.spec import ConfigError

    chain_yaml = tmp_path / "tiers.yaml"
    chain_yaml.write_text(yaml.safe_dump({"chain": [
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "fs")}]}))
    assert extra_config(chain_yaml, tenant="acme")["tenant"] == "acme"
    flag = sglang_args(chain_yaml, tenant="acme")
    assert json.loads(flag[flag.index("--hicache-storage-backend-extra-config") + 1])[
        "tenant"] == "acme"
    with pytest.raises(ConfigError, match="tenant"):
        extra_config(chain_yaml, tenant="../acme")
    from sglang_host import import_host_pools

    import_host_pools()
    from sglang_pages import storage_config

    from kvtier.contrib.sglang.storage import KvtierStorage

    with pytest.raises(ConfigError, match="tenant"):
        KvtierStorage(storage_config({"kvtier_config": str(chain_yaml), "tenant": "a b"}))
