"""pytest plugin of the conformance kit (registered through ``pytest11``)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kvtier_group(name): the conformance kit group of a test")
