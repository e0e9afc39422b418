"""The noisy neighbour, on real processes and real files: two tenants' processes share an ``fs``
pool; tenant ``noisy`` writes ten times its quota while tenant ``quiet`` reads its working
set (a miss puts the block back, as a cache does).

- ``quiet``'s hit ratio stays within 1 point of its run alone;
- the bytes each tenant holds never exceed its quota plus the in-flight bound
  (docs/shared-capacity.md): its room counted in the pool's index, read as a
  snapshot every few milliseconds, never exceeds the quota (writes in flight are
  counted before their files are written); its files, walked meanwhile (not a
  snapshot: a file deleted after the walk passed it and one written before the
  walk reaches it are both seen), at most one block beyond it.

The control runs the same processes without ``tenants`` (one capacity, the same bytes
in all): there the noisy tenant takes the quiet one's blocks, and its hit ratio falls
by more than a point: the proof fails without the feature.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvtier.backends.fs.pool import DB_NAME

CHILD = Path(__file__).resolve().parents[2] / "support" / "fs_tenant_child.py"
KiB, MiB = 1 << 10, 1 << 20
SIZE = 64 * KiB
NOISY_NS, QUIET_NS = "a" * 32, "b" * 32
QUOTA = {"noisy": 1 * MiB, "quiet": 4 * MiB}
RULES = {"*": {"quota": QUOTA["noisy"]}, "quiet": {"quota": QUOTA["quiet"]}}
CAPACITY = 8 * MiB  # the quotas fit: each tenant is bound by its own quota alone
WORK = {"keys": 96, "steps": 1500, "size": SIZE, "alpha": 0.5}  # 1.5x the quiet quota

pytestmark = pytest.mark.timeout(600)


class Sampler(threading.Thread):
    """Each tenant's bytes, as the index counts them and as files on disk, at their most."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.stop = threading.Event()
        self.counted: dict[str, int] = {}
        self.files: dict[str, int] = {}
        self.samples = 0

    def run(self) -> None:
        while not self.stop.wait(0.005):
            self._counted()
            for tenant, ns in (("noisy", NOISY_NS), ("quiet", QUIET_NS)):
                self.files[tenant] = max(self.files.get(tenant, 0), _file_bytes(self.root / ns))
            self.samples += 1

    def _counted(self) -> None:
        path = self.root / DB_NAME
        if not path.exists():
            return
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            rows = db.execute("SELECT t.tenant, x.bytes FROM totals AS x JOIN tenants AS t "
                              "ON t.ns = x.scope").fetchall()
        except sqlite3.OperationalError:  # no tenants table yet, or the index busy
            rows = []
        finally:
            db.close()
        for tenant, counted in rows:
            self.counted[tenant] = max(self.counted.get(tenant, 0), counted)


def _file_bytes(folder: Path) -> int:
    total = 0
    for where, _, names in os.walk(folder):
        for name in names:
            if name.endswith(".kvi"):
                continue  # the namespace's snapshot of its index, written at close
            with contextlib.suppress(FileNotFoundError):  # evicted meanwhile
                total += os.stat(os.path.join(where, name)).st_size
    return total


def _spawn(spec: dict[str, Any]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _report(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return dict(json.loads(out.strip().splitlines()[-1]))


def run(root: Path, noisy: bool, tenants: bool) -> tuple[dict[str, Any], dict[str, Any],
                                                         Sampler]:
    """The quiet tenant's working set, beside the noisy tenant's flood if ``noisy``."""
    root.mkdir()
    gate, stop = root.parent / f"{root.name}.gate", root.parent / f"{root.name}.stop"
    options: dict[str, Any] = {"capacity_scope": "pool", "eviction": "lru"}
    if tenants:
        options.update(capacity=CAPACITY, tenants=RULES)
    else:  # the control: one capacity, as many bytes as the two quotas
        options.update(capacity=QUOTA["noisy"] + QUOTA["quiet"])
    base = {"url": f"file://{root}", "gate": str(gate), "stop": str(stop)}
    quiet = _spawn({**base, "namespace": QUIET_NS, "mode": "work", **WORK,
                    "options": {**options, "tenant": "quiet"}})
    flood = _spawn({**base, "namespace": NOISY_NS, "mode": "flood", "size": SIZE,
                    "options": {**options, "tenant": "noisy"}}) if noisy else None
    sampler = Sampler(root)
    sampler.start()
    gate.touch()
    try:
        quiet_report = _report(quiet)
    finally:
        stop.touch()
        flood_report = _report(flood) if flood is not None else {}
        sampler.stop.set()
        sampler.join()
    return quiet_report, flood_report, sampler


def _ratio(report: dict[str, Any]) -> float:
    assert report["wrong"] == 0  # never a wrong block
    return float(report["hits"] / (report["hits"] + report["misses"]))


def test_a_noisy_tenant_leaves_the_quiet_ones_hit_ratio(tmp_path: Path) -> None:
    alone, _, _ = run(tmp_path / "alone", noisy=False, tenants=True)
    beside, noisy, sampler = run(tmp_path / "noisy", noisy=True, tenants=True)
    print(f"quiet alone {_ratio(alone):.4f}, beside the noisy tenant {_ratio(beside):.4f}; "
          f"noisy put {noisy['put_bytes'] / MiB:.1f} MiB; most counted {sampler.counted}, "
          f"most on disk {sampler.files}, {sampler.samples} samples")
    assert noisy["put_bytes"] >= 10 * QUOTA["noisy"]  # ten times its quota, meanwhile
    assert abs(_ratio(alone) - _ratio(beside)) <= 0.01
    assert sampler.samples > 10
    for tenant, quota in QUOTA.items():
        assert 0 < sampler.counted[tenant] <= quota  # room in flight counted in it
        assert sampler.files[tenant] <= quota + SIZE  # a walk is no snapshot: one block
    # the noisy tenant's puts beyond its quota were stored, evicting its own blocks; every
    # block the quiet tenant lost, it evicted itself (its working set is beyond its quota)
    assert noisy["stored"] * SIZE >= 10 * QUOTA["noisy"]
    assert noisy["stats"]["tenant_evicted.noisy"] >= noisy["stored"] - QUOTA["noisy"] // SIZE
    quiet = beside["stats"]
    print(quiet)
    assert quiet["tenant_evicted.quiet"] == quiet["evictions"]


def test_without_tenants_the_noisy_one_takes_the_quiet_ones_blocks(tmp_path: Path) -> None:
    """The control: the same processes and bytes, no ``tenants``: the proof above fails."""
    alone, _, _ = run(tmp_path / "alone", noisy=False, tenants=False)
    beside, noisy, _ = run(tmp_path / "noisy", noisy=True, tenants=False)
    print(f"control: quiet alone {_ratio(alone):.4f}, beside {_ratio(beside):.4f}; noisy put "
          f"{noisy['put_bytes'] / MiB:.1f} MiB")
    assert noisy["put_bytes"] >= 10 * QUOTA["noisy"]
    assert _ratio(alone) - _ratio(beside) > 0.01


def test_a_quota_holds_for_a_tenants_processes_together(tmp_path: Path) -> None:
    """Two processes of one tenant (two engines on its namespace) flood together: the
    pool counts them as one tenant, so their blocks together stay within its quota."""
    root = tmp_path / "root"
    root.mkdir()
    gate, stop = tmp_path / "gate", tmp_path / "stop"
    options = {"capacity_scope": "pool", "eviction": "lru", "capacity": CAPACITY,
               "tenants": RULES, "tenant": "noisy"}
    floods = [_spawn({"url": f"file://{root}", "gate": str(gate), "stop": str(stop),
                      "namespace": NOISY_NS, "mode": "flood", "size": SIZE,
                      "options": options}) for _ in range(2)]
    sampler = Sampler(root)
    sampler.start()
    gate.touch()
    try:
        while sampler.samples < 200:
            time.sleep(0.05)
    finally:
        stop.touch()
        reports = [_report(p) for p in floods]
        sampler.stop.set()
        sampler.join()
    print(f"two processes put {[r['put_bytes'] / MiB for r in reports]} MiB; most counted "
          f"{sampler.counted}, most on disk {sampler.files}")
    assert all(r["put_bytes"] >= 5 * QUOTA["noisy"] for r in reports)
    assert sampler.counted["noisy"] <= QUOTA["noisy"]
    assert sampler.files["noisy"] <= QUOTA["noisy"] + SIZE  # a walk is no snapshot
    assert _file_bytes(root / NOISY_NS) <= QUOTA["noisy"]  # all closed: a true count
