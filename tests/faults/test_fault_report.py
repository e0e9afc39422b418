"""report.py renders every section the fault tests write, and only those present."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from faultkit import Report

REPORT = Path(__file__).with_name("report.py")


def test_report_renders_every_section(tmp_path: Path) -> None:
    report = Report(tmp_path / "figures.json")
    report.record("crash_long", "long", kills=200, keys_checked=9, keys_present_exact=7,
                  in_flight_absent=1, wrong=0, corrupt=0)
    report.record("bitrot_header_exhaustive", "ci", flipped=10, detected=9, served_wrong=0,
                  harmless=1)
    report.record("foreign_fs", "ci", attempts=30, returned=0, namespaces=5)
    report.record("loss_peer", "ci", in_flight_keys=24, in_flight_wrong=0, in_flight_served=0,
                  raised=0, recovered=True, recovery_s=0.4)
    report.record("diskfull_tmpfs", "ci", attempted=24, failed=10, counted=10, partial_files=0,
                  existing_reads_exact=6, chain_reads_right_after=0)
    report.record("soak_long", "long", seconds=60, threads=8, ops=1000, hits_checked=500,
                  final_keys_checked=90, lost=0, wrong=0, transient_misses=2,
                  capacity_exceeded=0, peak_ram_bytes=1, peak_disk_bytes=2,
                  ram_capacity_bytes=3, disk_capacity_bytes=4,
                  rss_growth_bytes=3 << 20)
    report.record("fuzz_config_5000", "long", examples=5000, untyped_errors=0)
    data = json.loads((tmp_path / "figures.json").read_text())
    assert set(data) == {"crash_long", "bitrot_header_exhaustive", "foreign_fs", "loss_peer",
                         "diskfull_tmpfs", "soak_long", "fuzz_config_5000"}
    out = subprocess.run([sys.executable, str(REPORT), str(tmp_path / "figures.json")],
                         capture_output=True, text=True, check=True).stdout
    rows = out.splitlines()[2:]
    assert len(rows) == len(data)
    assert "| Crash safety | long | 200 SIGKILLs" in out
    assert "9/9 detected, 0 served" in out
    assert "| Foreign namespace (fs) | ci |" in out
    assert "2 transient misses" in out and "RAM 1 of 3 bytes, fs 2 of 4)" in out
    assert "2 transient misses" in out and "RSS growth +3.0 MiB" in out
    assert "| Fuzz: YAML config loader | long | 5000 examples | 0 untyped errors |" in out
