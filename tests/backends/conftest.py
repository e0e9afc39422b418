"""Fixtures shared by the backend test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from host_blocks import POLICIES, MiB, open_host

from kvtier.plugins.registry import BackendHandle


@pytest.fixture(params=POLICIES)
def host(request: pytest.FixtureRequest) -> Iterator[BackendHandle]:
    """An open ``host`` backend of 64 MiB, once per eviction policy."""
    handle = open_host(64 * MiB, request.param)
    yield handle
    handle.close()
