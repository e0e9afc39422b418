"""The conformance kit on ``fs``: a local directory, ``memory://``, and ``s3://`` on SeaweedFS.

The ``s3://`` run uses the session's SeaweedFS (``s3_server``) and one bucket
for the module (``kit_bucket`` in ``tests/backends/conftest.py``).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from seaweed import SeaweedServer

from kvtier.testing import BackendTests
from kvtier.testing.keep import KeepTests


class TestFsFile(BackendTests):
    backend = "fs"

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"url": f"file://{tmp_path}/fs", "capacity": "12MiB"}


class TestFsKeep(KeepTests):
    """The kit's ``keep`` group on a local root's shared pool with a keep budget: a kept
    block survives three capacities of puts."""

    backend = "fs"

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"url": f"file://{tmp_path}/fs", "capacity": "8MiB",
                "tenants": {"*": {"keep": "2MiB"}}}


class TestFsMemory(BackendTests):
    backend = "fs"

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {"url": f"memory://kit-{uuid.uuid4().hex}", "io_threads": 1}


class TestFsOnSeaweed(BackendTests):
    backend = "fs"
    # fs asks the store about every key its index lacks (another process may
    # have stored it), so lookups and misses cost round trips: the slowest
    # backend here gets the smallest budgets
    stateful_max_examples = 6
    concurrency_steps = 60

    @pytest.fixture
    def backend_options(self, s3_server: SeaweedServer, kit_bucket: str) -> dict[str, Any]:
        return {
            "url": f"s3://{kit_bucket}/fs/{uuid.uuid4().hex[:8]}",
            "capacity": "2MiB",
            "storage_options": {
                "key": s3_server.access_key,
                "secret": s3_server.secret_key,
                "endpoint_url": s3_server.endpoint,
                "client_kwargs": {"region_name": s3_server.region},
                # every open is a new client: a cached one would carry its listings
                "skip_instance_cache": True,
            },
        }
