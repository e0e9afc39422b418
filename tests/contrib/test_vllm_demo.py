"""``make demo`` (``python -m kvtier.contrib.vllm.demo``) end to end, on a small model."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvtier.config import load_config
from kvtier.contrib.vllm.demo import _chain_yaml

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)


def test_demo_chain_is_valid_with_and_without_an_object_tier(tmp_path: Path) -> None:
    for endpoint, bucket, names in ((None, None, ["ram", "disk"]),
                                    ("http://127.0.0.1:9", "kv", ["ram", "disk", "s3"])):
        path = tmp_path / "tiers.yaml"
        path.write_text(_chain_yaml(tmp_path / "kv", endpoint, bucket))
        chain = load_config(path)
        assert [t.name for t in chain.tiers] == names
        assert yaml.safe_load(path.read_text())["chain"][1]["url"] == f"file://{tmp_path}/kv"


@needs_vllm
def test_demo_serves_the_second_run_from_the_chain(tmp_path: Path) -> None:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier.contrib.vllm.demo", "--dir", str(tmp_path),
         "--tokens", "256", "--layers", "2", "--hidden", "256"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    miss = re.search(r"run 1 \(miss\): time to first token [0-9.]+ s, (\d+) of 256", out)
    hit = re.search(r"run 2 \(hit\): time to first token [0-9.]+ s, (\d+) of 256", out)
    assert miss and hit, out
    # the first process computed everything; the second got whole blocks of 32 from kvtier
    assert int(miss.group(1)) == 0
    assert int(hit.group(1)) >= 224 and int(hit.group(1)) % 32 == 0
    assert "first token identical: True" in out
    files = list((tmp_path / "kv").rglob("*.kvb"))
    assert files, "the fs tier holds no blocks"
