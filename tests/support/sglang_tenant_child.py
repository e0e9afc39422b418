"""One SGLang engine process's HiCache storage, of one configured tenant (test_sglang_tenants.py).

    python sglang_tenant_child.py SPEC

``SPEC`` is JSON: ``yaml`` (the chain), ``tenant``, ``mode`` (``write`` or
``read``), ``seed`` (``write``: the host pool's random bytes).  The backend is
built as SGLang's cache controller builds it (its ``StorageBackendFactory``,
then the host pool's registration), in SGLang's own host pool; pages move
through ``HiCacheController``'s zero-copy page paths, keyed by SGLang's page
hashes of one made-up prompt (the same in every process).  The last line
printed is a JSON report: the namespace, how many pages exist and loaded, and
the SHA-256 of each page's bytes in the host pool afterwards.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from sglang_host import mha_pool
from sglang_pages import (
    StorageBackendFactory,
    extra_config,
    fill_random,
    load_v1,
    page_bytes,
    page_hashes,
    save_v1,
    storage_config,
)

PAGES = 4


def main() -> None:
    spec = json.loads(sys.argv[1])
    pool = mha_pool("page_first")
    extra = extra_config(Path(spec["yaml"]), tenant=spec["tenant"])
    backend = StorageBackendFactory.create_backend(
        "dynamic", storage_config(extra, is_page_first_layout=True), pool)
    backend.register_mem_pool_host(pool)
    keys = page_hashes(PAGES)
    report = {"namespace": backend.chain.namespace.hex, "tenant": backend.tenant}
    if spec["mode"] == "write":
        fill_random(pool, spec["seed"])
        report["saved"] = save_v1(backend, pool, keys, 0)
    else:
        report["exists"] = backend.batch_exists(keys)
        report["loaded"] = load_v1(backend, pool, keys, 0)
    report["pages"] = [hashlib.sha256(p).hexdigest() for p in page_bytes(pool, 0, PAGES)]
    backend.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
