"""Fixtures shared by the config test modules."""

from __future__ import annotations

import pytest
from config_fakes import FakeFs, FakeHost

from kvtier.plugins.registry import INSTALL_HINTS, BackendRegistry


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> BackendRegistry:
    # only the fakes of config_fakes: what else is installed (kvtier-redis, say) must not
    # change the messages checked here
    reg = BackendRegistry(group="kvtier.tests.no-entry-points")
    monkeypatch.setitem(INSTALL_HINTS, "lmdb", "pip install kvtier-lmdb")
    reg.register("host", FakeHost)
    reg.register("fs", FakeFs)
    return reg
