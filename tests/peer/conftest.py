"""Fixtures shared by the peer test modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from peer_server import PeerServer

from kvtier.backends.peer import PeerBackend
from kvtier.plugins.registry import BackendRegistry


@pytest.fixture
def registry() -> BackendRegistry:
    reg = BackendRegistry()  # host and fs come from the entry points
    reg.register("peer", PeerBackend)  # until pyproject lists it
    return reg


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PeerServer]:
    with PeerServer(tmp_path / "node") as srv:
        yield srv
