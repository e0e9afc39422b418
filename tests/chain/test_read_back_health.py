"""A read-back is a measurement (kvtier.chain.readback): its fault is counted and logged, but
does not back the tier off, so the reads that serve requests go on.

The tier is the sample plugin's ``sample-slow`` backend with its blocks in a
folder: one block's file replaced by a folder makes the backend raise on the
get of that block alone, as a disk that fails one read does.
"""

from __future__ import annotations

import logging
import shutil
import socket
import time
import urllib.request
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


def _store_and_fail_a_read_back(chain: kvtier.Chain, root: Path) -> Path:
    """Store 8 blocks with loads weighed, so the unmeasured tier is read back, and make the
    last block stored (the first read back) raise in the backend; wait for the fault to be
    counted.  Returns the path that raises (a folder where the block's file was)."""
    for tokens in (512, 1024, 2048):  # loads are weighed: an unmeasured tier is read back
        assert chain.recompute.observe(tokens, tokens * 1e-3)
    assert chain.put(KEYS, BLOCKS) == [True] * 8
    (path,) = root.glob(f"*/{KEYS[-1].hex()}")
    path.unlink()
    path.mkdir()
    deadline = time.monotonic() + 10
    while chain.stats()["tiers"][0]["errors"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return path


def _config(root: Path, **more: object) -> dict[str, object]:
    return {"chain": [{"name": "slow", "backend": "sample-slow", "root": str(root),
                       "persistent": True}], **more}


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readback, "QUIET_S", 0.3)  # the tier idle after 0.3 s without stores


def test_a_read_back_that_fails_leaves_the_tier_serving(
    tmp_path: Path, sample_plugin: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "slow"
    with kvtier.open_chain(_config(root), NS, registry=BackendRegistry()) as chain:
        path = _store_and_fail_a_read_back(chain, root)
        tier = chain.stats()["tiers"][0]
        # the tier not backed off: a request's reads, right after, are served ...
        assert tier["healthy"] is True
        out = [bytearray(BLOCK) for _ in KEYS[:4]]
        assert chain.get(KEYS[:4], out) == [True] * 4
        assert [bytes(o) for o in out] == BLOCKS[:4]
        # ... and the fault counted in the tier's errors and logged, no sample taken
        tier = chain.stats()["tiers"][0]
        assert (tier["errors"], tier["read_backs"], tier["read_back_failures"]) == (1, 0, 1)
        assert any("read-back of tier 0 failed" in r.getMessage() for r in caplog.records
                   if r.levelno >= logging.WARNING)
        shutil.rmtree(path)


def test_a_failed_read_back_is_counted_in_stats_and_on_the_prometheus_endpoint(
    tmp_path: Path, sample_plugin: str
) -> None:
    """An operator sees why a tier stayed unmeasured: its read-back failed.  The failure is
    a figure of its own, apart from the tier's errors that requests' reads also count."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    root = tmp_path / "slow"
    config = _config(root, metrics={"prometheus_port": port})
    with kvtier.open_chain(config, NS, registry=BackendRegistry()) as chain:
        path = _store_and_fail_a_read_back(chain, root)
        tier = chain.stats()["tiers"][0]
        assert (tier["read_back_failures"], tier["read_backs"], tier["errors"]) == (1, 0, 1)
        assert tier["load_cost"]["measured"] is False  # no sample: still unmeasured
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=10).read().decode()
        shutil.rmtree(path)
    labels = f'backend="sample-slow",namespace="{NS.hex}",tier="slow"'
    lines = [x for x in text.splitlines() if x.startswith("kvtier_tier_read_back_")]
    assert sorted(lines) == [f"kvtier_tier_read_back_blocks_total{{{labels}}} 0.0",
                             f"kvtier_tier_read_back_failures_total{{{labels}}} 1.0"]
    assert f"kvtier_tier_errors_total{{{labels}}} 1.0" in text
