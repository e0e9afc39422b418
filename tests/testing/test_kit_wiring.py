"""The conformance kit's own machinery: gates, kill points, fresh locations, cleanup, fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import Capabilities, PluginError
from kvtier.testing.base import kit_group
from kvtier.testing.crash import spread_points
from kvtier.testing.groups import GATES, declares, implements, missing_capability
from kvtier.testing.locations import FreshLocations
from kvtier.testing.raw import RAW_ACCESS

TESTS_DIR = Path(__file__).resolve().parents[1] / "support"


def test_gates_are_predicates_with_the_words_reports_show() -> None:
    caps = Capabilities(persistent=False, thread_safe=True, capacity=None)
    assert missing_capability("put_get", "x", caps, ()) is None
    assert missing_capability("persistence", "x", caps, ()) == (
        "backend 'x' does not declare persistent=True"
    )
    assert missing_capability("capacity", "x", caps, ()) == "backend 'x' declares no capacity"
    assert missing_capability("corruption", "x", caps, ()) == (
        "backend 'x' gives the kit no raw access to its stored bytes: no kit_tamper method "
        "(kvtier.testing.RawAccess), and the test class does not override tamper"
    )
    assert missing_capability("corruption", "x", caps, {RAW_ACCESS}) is None
    # the deprecated hook counts through the kit's raw access, not as a hook name
    assert missing_capability("corruption", "x", caps, {"kvtier_tamper"}) is not None
    assert missing_capability("concurrency", "x", caps, ()) is None
    assert missing_capability("capacity", "x", Capabilities(capacity=10), ()) is None
    assert GATES["crash_safety"].needs == "persistent=True"
    assert implements("kvtier_scan").holds(caps, {"kvtier_scan"})
    with pytest.raises(ValueError, match="no boolean"):
        declares("capacity")


def test_kit_group_refuses_an_unknown_group() -> None:
    with pytest.raises(ValueError, match="unknown kit group"):
        kit_group("nope")


def test_spread_points_take_every_call_when_few() -> None:
    assert spread_points(5, [(0, 2), (2, 5)], 8) == [0, 1, 2, 3, 4]


def test_spread_points_keep_the_ends_of_every_put() -> None:
    puts = [(0, 100), (100, 103), (103, 300)]
    points = spread_points(300, puts, 24)
    for start, end in puts:
        assert {start, start + 1, end - 2, end - 1} <= set(points)
    assert 0 in points and 299 in points
    assert len(points) <= 24 and points == sorted(set(points))


def test_fresh_locations_per_test(tmp_path: Path) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    options = {
        "path": str(existing),
        "dir": str(tmp_path / "new" / "deeper" / "store.db"),
        "url": f"file://{tmp_path / 'fsroot'}",
        "other": "memory://shared",
        "capacity": "4MiB",
    }
    fresh = FreshLocations(options, token="t0")
    assert set(fresh.bases) == {"path", "dir", "url"}
    fresh.start()
    with fresh.for_test("test_round_trip[1B]") as given:
        assert given["path"] == str(existing / "kvtier-conformance-t0" / "test_round_trip_1B")
        assert Path(given["path"]).is_dir()
        run = tmp_path / "new" / "deeper" / "kvtier-conformance-t0" / "test_round_trip_1B"
        assert given["dir"] == str(run / "store.db") and not (run / "store.db").exists()
        assert given["url"] == f"file://{tmp_path}/kvtier-conformance-t0/test_round_trip_1B/fsroot"
        assert (given["other"], given["capacity"]) == ("memory://shared", "4MiB")
        (Path(given["path"]) / "block").write_bytes(b"x")
    assert not (existing / "kvtier-conformance-t0" / "test_round_trip_1B").exists()
    fresh.finish()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]
    assert list(existing.iterdir()) == []
    assert "path: " in fresh.describe()[0]


def test_options_naming_no_local_location_are_shared() -> None:
    fresh = FreshLocations({"url": "redis://127.0.0.1:1/0", "path": "s3://bucket/x", "n": 3})
    assert fresh.bases == {}


MODULE = '''
import pytest

from kvtier.testing import BackendTests


class TestShared(BackendTests):
    backend = "kit_broken_backends:DictBackend"

    @pytest.fixture
    def backend_options(self):
        return {{"dir": {shared!r}}}

    def test_store_fixture_is_the_open_instance(self, store):
        assert store is self.store
        assert store.put([b"mine"], [b"data"]) == [True]
        assert store.get([b"mine"]) == [b"data"]
'''


def test_kit_removes_what_it_stored_from_a_shared_store(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (tmp_path / "test_shared.py").write_text(MODULE.format(shared=str(shared)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS_DIR), *sys.path]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_shared.py",
         "--kvtier-group", "put_get", "--kvtier-group", "persistence",
         "--kvtier-group", "crash_safety",
         "-k", "store_fixture or round_trip or survive_reopen or every_step"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed" in proc.stdout
    namespaces = [p for p in shared.iterdir() if p.is_dir()]
    assert len(namespaces) > 3  # one per test
    left = [p for ns in namespaces for p in ns.iterdir()]
    assert left == [], f"the kit left {len(left)} files behind: {left[:3]}"


def test_an_unknown_backend_names_the_distribution_that_provides_it() -> None:
    registry = BackendRegistry(group="kvtier.no-such-group")
    with pytest.raises(PluginError, match="pip install kvtier-redis"):
        registry.info("redis")
    with pytest.raises(PluginError, match=r"pip install 'kvtier\[s3\]'"):
        registry.info("object")
