"""pytest plugin of the conformance kit (registered through the ``pytest11`` entry point).

Loaded by pytest in every project where kvtier is installed, so it stays
light: it imports neither Hypothesis nor the groups.  It registers the
``kvtier_group`` marker (so ``--strict-markers`` projects can run the kit),
adds ``--kvtier-group NAME`` to run only some groups, and asks pytest to
rewrite the kit's asserts so failures show the compared values.
"""

from __future__ import annotations

import pytest

from .groups import GROUPS

_KIT_MODULES = (
    "base",
    "capacity",
    "concurrency",
    "corruption",
    "crash",
    "lifecycle",
    "lookup_evict",
    "persistence",
    "put_get",
    "scan",
    "keep",
    "expire",
    "deadlines",
    "stateful",
    "suite",
)
pytest.register_assert_rewrite(*(f"kvtier.testing.{name}" for name in _KIT_MODULES))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvtier", "kvtier conformance kit")
    group.addoption(
        "--kvtier-group",
        action="append",
        default=[],
        metavar="NAME",
        choices=GROUPS,
        help=f"run only this group of the conformance kit (repeatable): {', '.join(GROUPS)}",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kvtier_group(name): the conformance kit group a test belongs to"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = set(config.getoption("kvtier_group") or ())
    if not wanted:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        marker = item.get_closest_marker("kvtier_group")
        selected = marker is not None and bool(marker.args) and marker.args[0] in wanted
        (keep if selected else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
