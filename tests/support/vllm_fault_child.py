"""One unwritable block file under vLLM's KvtierTier, for tests/contrib/test_vllm_tier_faults.py.

Run as ``python vllm_fault_child.py DIR`` without DAC override (see
fs_fault_child.py): an fs-only chain, the directory of one key's file made
unwritable, then 16 store jobs of one chunk each submitted at once, as
vLLM's scheduler submits them.  Prints one JSON line: each job's success.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from fs_fault_child import blocked_dir
from vllm_chain import SpecStub, write_yaml

from kvtier.chain.catalog import CATALOG_HEX
from kvtier.contrib.vllm.tier import KvtierTier, chain_key

ROW = 4096
BAD = 5


def main(directory: Path) -> dict[str, object]:
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob

    config = write_yaml(directory / "tiers.yaml", [
        {"name": "disk", "backend": "fs", "url": str(directory / "store"), "direct_io": False}])
    region = np.zeros((16, ROW), dtype=np.uint8)
    tier = KvtierTier(SpecStub(ROW, ("layers.0.attn", "layers.1.attn")), memoryview(region),
                      "KvtierTier", config=str(config))
    try:
        keys = [bytes([i, 0x40 + i]) * 18 for i in range(16)]
        (nsroot,) = [p for p in (directory / "store").iterdir() if p.name != CATALOG_HEX]
        hexkey = chain_key(keys[BAD]).hex()
        bad = nsroot / hexkey[0:2] / hexkey[2:4]
        bad.mkdir(parents=True)
        bad.chmod(0o555)
        if not blocked_dir(bad):
            return {"skip": "chmod 555 does not stop this process"}
        for i in range(16):
            region[i] = i + 1
        for i, key in enumerate(keys):
            tier.submit_store(TransferJob(i, [key], np.array([i], dtype=np.int32), False,
                                          ReqContext(req_id=f"r{i}")))
        done: dict[int, bool] = {}
        deadline = time.monotonic() + 60
        while len(done) < 16 and time.monotonic() < deadline:
            for res in tier.get_finished_jobs():
                done[res.job_id] = bool(res.success)
            time.sleep(0.005)
        tier.chain.flush()
        files = sorted(p.name for p in nsroot.rglob("*.kvb"))
        expected = sorted(f"{chain_key(k).hex()}.kvb" for i, k in enumerate(keys) if i != BAD)
        return {"success": [done.get(i) for i in range(16)], "files_exact": files == expected}
    finally:
        tier.shutdown()


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
