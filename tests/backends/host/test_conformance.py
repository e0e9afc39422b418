"""The conformance kit on ``host``, once per eviction policy."""

from __future__ import annotations

from typing import Any

import pytest

from kvtier.testing import BackendTests
from kvtier.testing.keep import KeepTests


class TestHostLru(BackendTests):
    backend = "host"

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {"capacity": "12MiB"}


class TestHostArc(BackendTests):
    backend = "host"

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {"capacity": "2MiB", "eviction": "arc", "max_block_size": "1MiB"}


class TestHostAdaptive(BackendTests):
    backend = "host"

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {"capacity": "2MiB", "eviction": "adaptive", "max_block_size": "1MiB"}


class TestHostS3Fifo(BackendTests):
    backend = "host"

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {"capacity": "2MiB", "eviction": "s3fifo", "max_block_size": "1MiB"}


class TestHostKeep(KeepTests):
    """The kit's ``keep`` group alone, with a keep budget: a block kept under pressure (a
    ``tenants`` rule puts a host tier's namespaces in one capacity, which the kit's other
    groups do not expect of a tier opened alone)."""

    backend = "host"

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {"capacity": "2MiB", "tenants": {"*": {"keep": "512KiB"}}}
