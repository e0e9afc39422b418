"""A read-back is a measurement (kvtier.chain.readback): its fault is counted and logged, but
does not back the tier off, so the reads that serve requests go on.

The tier is the sample plugin's ``sample-slow`` backend with its blocks in a
folder: one block's file replaced by a folder makes the backend raise on the
get of that block alone, as a disk that fails one read does.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import pytest
from sample_plugin import sample_plugin

import kvtier
from kvtier.chain import readback
from kvtier.plugins.registry import BackendRegistry

__all__ = ["sample_plugin"]

NS = kvtier.Namespace("read-back-health", dtype="bfloat16", tokens_per_block=16)
BLOCK = 64 * 1024
KEYS = [b"rh-%d" % i for i in range(8)]
BLOCKS = [bytes([i + 1]) * BLOCK for i in range(8)]


def test_a_read_back_that_fails_leaves_the_tier_serving(
    tmp_path: Path, sample_plugin: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(readback, "QUIET_S", 0.3)  # the tier idle after 0.3 s without stores
    root = tmp_path / "slow"
    config = {"chain": [{"name": "slow", "backend": "sample-slow", "root": str(root),
                         "persistent": True}]}
    with kvtier.open_chain(config, NS, registry=BackendRegistry()) as chain:
        for tokens in (512, 1024, 2048):  # loads are weighed: an unmeasured tier is read back
            assert chain.recompute.observe(tokens, tokens * 1e-3)
        assert chain.put(KEYS, BLOCKS) == [True] * 8
        # the last block stored, the first read back, cannot be read: the backend raises
        (path,) = root.glob(f"*/{KEYS[-1].hex()}")
        path.unlink()
        path.mkdir()
        deadline = time.monotonic() + 10
        while chain.stats()["tiers"][0]["errors"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        tier = chain.stats()["tiers"][0]
        # the tier not backed off: a request's reads, right after, are served ...
        assert tier["healthy"] is True
        out = [bytearray(BLOCK) for _ in KEYS[:4]]
        assert chain.get(KEYS[:4], out) == [True] * 4
        assert [bytes(o) for o in out] == BLOCKS[:4]
        # ... and the fault counted in the tier's errors and logged, no sample taken
        tier = chain.stats()["tiers"][0]
        assert (tier["errors"], tier["read_backs"]) == (1, 0)
        assert any("read-back of tier 0 failed" in r.getMessage() for r in caplog.records
                   if r.levelno >= logging.WARNING)
        shutil.rmtree(path)
