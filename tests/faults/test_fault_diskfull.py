"""Disk full on the fs tier, under a real kernel limit.

Two limits: a 4 MiB tmpfs (ENOSPC; needs mount rights, skipped where the
container refuses them) and RLIMIT_FSIZE in the writing process (EFBIG; no
privileges needed, so this one runs everywhere).  The scenario runs in a
child process (diskfull_child.py) so the limit never touches pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from faultkit import Report

CHILD = Path(__file__).with_name("diskfull_child.py")


def run_child(mode: str, directory: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(CHILD), mode, str(directory)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def mounted_tmpfs(directory: Path) -> bool:
    directory.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(directory)],
                          capture_output=True, text=True, check=False)
    return proc.returncode == 0


@pytest.fixture(scope="module", params=["tmpfs", "fsize"])
def scenario(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("full") / "disk"
    if request.param == "fsize":
        return run_child("fsize:200000", directory)  # files of 64 KiB fit, 256 KiB do not
    if not mounted_tmpfs(directory):
        pytest.skip("this container refuses mount(2); the fsize variant covers disk full")
    try:
        return run_child("tmpfs", directory)
    finally:
        subprocess.run(["umount", str(directory)], check=False)


def test_stores_fail_cleanly_and_are_counted(scenario: dict[str, Any],
                                             fault_report: Report) -> None:
    assert scenario["existing_stored"] == [True] * 6
    assert scenario["failed"] > 0  # the limit was really reached
    assert scenario["stats_errors"] >= scenario["failed"]  # one fault per failed call
    assert scenario["tmp_files"] == 0 and scenario["damaged_files"] == 0
    assert scenario["stored_large_exact"]
    assert scenario["backend_reads_right_after_failure"] == [True] * 6
    assert scenario["reads_after_backoff"] == [True] * 6
    assert scenario["store_after_room"] == [True] and scenario["probe_exact"] == [True]
    fault_report.record(
        f"diskfull_{scenario['mode'].split(':')[0]}", "ci", attempted=scenario["attempted"],
        failed=scenario["failed"], counted=scenario["stats_errors"],
        partial_files=scenario["tmp_files"] + scenario["damaged_files"],
        existing_reads_exact=sum(scenario["backend_reads_right_after_failure"]),
        chain_reads_right_after=sum(scenario["reads_right_after_failure"]),
    )


def test_chain_reads_right_after_a_failed_store(scenario: dict[str, Any]) -> None:
    assert scenario["reads_right_after_failure"] == [True] * 6
