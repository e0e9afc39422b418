"""The conformance kit on ``object`` against the session's SeaweedFS (``s3_server``).

The tests of the module share one bucket (``kit_bucket`` in
``tests/backends/conftest.py``); each has a namespace and a prefix of its own.
The kit on a replicated SeaweedFS cluster is in ``test_on_cluster.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from seaweed import SeaweedServer, object_options

from kvtier.testing import BackendTests
from kvtier.testing.keep import KeepTests

#: Hypothesis budget of the stateful group here: every step is a network round
#: trip to a server sharing two cores with the test, so fewer examples than the
#: kit's default of 50 keep the run short while still mixing every operation.
REMOTE_STATEFUL_EXAMPLES = 15


class TestObjectOnSeaweed(BackendTests):
    backend = "object"
    stateful_max_examples = REMOTE_STATEFUL_EXAMPLES

    @pytest.fixture
    def backend_options(self, s3_server: SeaweedServer, kit_bucket: str) -> dict[str, Any]:
        return object_options(s3_server, kit_bucket)


class TestObjectWithCapacity(BackendTests):
    """With ``capacity`` the backend keeps an index and deletes the oldest blocks."""

    backend = "object"
    stateful_max_examples = REMOTE_STATEFUL_EXAMPLES

    @pytest.fixture
    def backend_options(self, s3_server: SeaweedServer, kit_bucket: str) -> dict[str, Any]:
        # small: the capacity group puts three times the capacity, block by block
        return object_options(s3_server, kit_bucket, capacity="1MiB")

    def test_capacity_holds_for_all_instances_together(self) -> None:
        pytest.skip(
            "object bounds each writer's view of the namespace, which learns of the others' "
            "blocks at its next LIST: N writers hold up to N x capacity (docs/shared-capacity.md)"
        )


class TestObjectKeep(KeepTests):
    """The kit's ``keep`` group with a keep budget: a block kept while the kit fills the
    capacity three times over (with no budget, as above, the capacity test skips)."""

    backend = "object"

    @pytest.fixture
    def backend_options(self, s3_server: SeaweedServer, kit_bucket: str) -> dict[str, Any]:
        return object_options(s3_server, kit_bucket, capacity="1MiB",
                              tenants={"*": {"keep": "256KiB"}})


def test_cli_certifies_crash_safety_of_native_writes(
    s3_server: SeaweedServer, kit_bucket: str, tmp_path: Path
) -> None:
    """``kvtier conformance object`` reads the backend's ``kit_native_writes``: obstore
    makes no Python-level I/O call, so the every-step crash test skips with the
    backend's reason, and the random-instants one runs and passes."""
    options = object_options(s3_server, kit_bucket)
    del options["allow_http"]  # derived from the endpoint's http://
    report = tmp_path / "report.json"
    cli = "from kvtier.cli.conformance import conformance_command; conformance_command()"
    args = [f"--option={key}={value}" for key, value in options.items()]
    proc = subprocess.run(
        [sys.executable, "-c", cli, "object", *args, "--group", "crash_safety",
         "--report", str(report)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env=dict(os.environ, COLUMNS="200"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    group = json.loads(report.read_text())["groups"]["crash_safety"]
    assert (group["passed"], group["failed"], group["skipped"]) == (1, 0, 1), group
    (reason,) = group["skip_reasons"]
    assert reason.startswith("0 kill points, the backend's writes are native: obstore"), reason
    assert group["figures"]["kill_points"] == 0, group
