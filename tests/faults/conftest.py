"""Fixtures of the fault suite: the figures report, long variants, fast recovery.

Every fault test records what it measured through ``fault_report``; the
figures land in one JSON file (``$KVTIER_FAULT_REPORT``, else
``fault-report.json`` in pytest's base temporary directory) that
``tests/faults/report.py`` renders as the table of docs/reliability.md.

Long variants carry the ``slow`` marker and run only when the marker is
selected (``-m slow``): the default run is the CI length.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from faultkit import Report

import kvtier.backends.peer.wire as peer_wire
import kvtier.chain.health as tier_module


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr") or ""):
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="long variant: select it with -m slow")
    for item in items:
        if item.get_closest_marker("slow") and here in Path(str(item.path)).parents:
            item.add_marker(skip)


_REPORT = pytest.StashKey[Report]()


@pytest.fixture(scope="session")
def fault_report(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Report:
    path = os.environ.get("KVTIER_FAULT_REPORT") or str(
        tmp_path_factory.getbasetemp() / "fault-report.json"
    )
    report = Report(Path(path))
    request.config.stash[_REPORT] = report
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    report = config.stash.get(_REPORT, None)
    if report is not None and report.written:
        terminalreporter.write_line(f"fault figures: {report.path} "
                                    "(render: python tests/faults/report.py FILE)")


@pytest.fixture
def fast_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short tier back-offs: recovery is waited for, so shorter waits keep the suite quick."""
    monkeypatch.setattr(tier_module, "_BACKOFF_FIRST", 0.05)
    monkeypatch.setattr(tier_module, "_BACKOFF_MAX", 0.5)
    monkeypatch.setattr(peer_wire, "BACKOFF_MAX", 0.5)
