"""vLLM's KvtierTier: one unwritable block file fails its own store job and no other.

vLLM's tiering manager runs store jobs side by side; a fault of one block's
file must not back the fs tier off so that the jobs beside it are skipped.
The fault is a real permission fault, in a child process without DAC
override (tests/support/vllm_fault_child.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from fs_fault_child import without_dac

CHILD = Path(__file__).parents[1] / "support" / "vllm_fault_child.py"


def test_one_unwritable_file_fails_only_its_own_store_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("vllm")
    paths = (str(CHILD.parent), os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    proc = without_dac([sys.executable, str(CHILD), str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in seen:
        pytest.skip(seen["skip"])
    assert seen["success"] == [i != 5 for i in range(16)]
    assert seen["files_exact"] is True
