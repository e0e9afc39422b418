"""The conformance kit, run on backends that must pass it and on broken ones it must fail.

The ``Test*`` classes below are the kit itself running in this suite: every
group against the reference dict backend and a two-tier chain (each built-in
backend's run sits among its own tests, ``tests/backends/<name>/test_conformance.py``
and ``tests/peer/test_peer_conformance.py``).  The broken backends of
``kit_broken_backends`` are certified in subprocesses through ``kvtier
conformance``, whose JSON report must name the groups that catch each bug.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import click
import pytest
from kit_broken_backends import BROKEN
from kit_planted_backends import PLANTED, DeclaresNativeWrites

import kvtier
from kvtier.cli.conformance import parse_option
from kvtier.spec import CONTRACT_VERSION
from kvtier.testing import GROUPS, BackendTests, KitBase
from kvtier.testing.crash import CrashSafetyTests


class TestReferenceBackend(BackendTests):
    backend = "kit_broken_backends:DictBackend"

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"dir": str(tmp_path / "store"), "capacity": "4MiB"}


class TestReferenceInMemory(BackendTests):
    backend = "kit_broken_backends:DictBackend"


class TestReferenceShared(BackendTests):
    backend = "kit_planted_backends:SharedDict"

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {"capacity": "4MiB"}


class TestChainWriteBack(BackendTests):
    backend = "kit_targets:ChainBackend"

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {"url": f"memory://kit-chain-{uuid.uuid4().hex}", "ram": "256KiB"}


class TestChainWriteThrough(BackendTests):
    backend = "kit_targets:ChainBackend"

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"url": f"file://{tmp_path}/chain", "ram": "256KiB", "disk_write": "through"}


# --- the kit must catch bugs ------------------------------------------------------

TESTS_DIR = Path(__file__).resolve().parents[1] / "support"

#: Broken backend -> the groups of the kit that fail on it (and no others).
CAUGHT_BY = {
    "AliasesBuffer": {"put_get"},
    "ForgetsOnReopen": {"persistence", "crash_safety"},
    "ClaimsShared": {"shared"},
    "IgnoresCapacity": {"capacity", "recency"},
    "KeepsLastRepeated": {"put_get"},
    "LookupEvicts": {"capacity", "recency", "persistence"},
    "LookupRefreshes": {"recency"},
    "MixesRepeatedKeys": {"put_get"},
    "NotThreadSafe": {"concurrency"},
    "RaisesOnMiss": {
        "put_get", "lookup", "evict", "capacity", "recency", "persistence", "concurrency",
        "crash_safety", "lifecycle",
    },
    "ReplacesStored": {"put_get"},
    "ResurrectsAfterReopen": {"persistence"},
    "ReusesReadBuffers": {"put_get", "corruption"},
    "ScanIgnoresNamespace": {"scan"},
    "ScanListsEvicted": {"scan"},
    "ScanSizesOnDisk": {"scan"},
    "ServesEvicted": {"lookup", "evict", "recency"},
    "SilentEvictions": {"capacity", "concurrency"},
    "TamperMissesCache": {"corruption"},
    "TornWrites": {"crash_safety"},
    "TwoStepWrites": {"crash_safety"},
    "UsableAfterClose": {"lifecycle"},
    "WrongKeyOrder": {"put_get", "lookup", "evict", "concurrency", "lifecycle"},
    "WrongUsedAfterReopen": {"persistence"},
    # kit_planted_backends: mistakes that once passed every check
    "CapacityPerInstance": {"shared"},
    "ClassLevelRecency": {"recency"},
    "CloseClosesAll": {"lifecycle"},
    "CountsEveryNamespace": {"lifecycle"},
    "EvictionsStayZero": {"capacity"},
    "GetIsNoUse": {"recency"},
    "NativeWrites": {"crash_safety"},
    "RefusesWithValueError": {"lifecycle"},
    "ReportsEvictedLater": {"capacity"},
    "ScanRefreshes": {"recency"},
    "StoredPutIsNoUse": {"recency"},
}

#: Where each broken backend is defined.
MODULE = {**dict.fromkeys(BROKEN, "kit_broken_backends"),
          **dict.fromkeys(PLANTED, "kit_planted_backends")}

#: Groups that may also fail, depending on thread timing: LookupEvicts drops blocks
#: silently once its lookups have charged enough to the capacity, which the
#: concurrency group's lookups reach on some runs only.
MAY_ALSO_CATCH = {"LookupEvicts": {"concurrency"}}

#: Broken backend -> (the kit test that must fail on it, words its message must hold):
#: the check written for that bug, not another group, is what catches it.
CAUGHT_AS = {
    "LookupEvicts": ("test_capacity_holds_and_evictions_are_reported", "caused by lookup"),
    "MixesRepeatedKeys": ("test_repeated_key_with_different_bytes_in_one_put", "a mix"),
    "ReplacesStored": ("test_put_of_a_stored_key_keeps_the_stored_block", "immutable once stored"),
    "KeepsLastRepeated": (
        "test_repeated_key_in_one_put_stores_the_first", "read back occurrence 3"
    ),
    "LookupRefreshes": ("test_lookup_is_not_a_use", "the lookup refreshed its recency"),
    "ClaimsShared": ("test_a_put_by_one_is_a_hit_for_the_other", "returned a miss"),
    "ReusesReadBuffers": (
        "test_returned_blocks_survive_reuse_of_read_buffers", "must not reuse a buffer"
    ),
    "ScanIgnoresNamespace": ("test_scan_keeps_namespaces_apart", "of other namespaces"),
    "ScanListsEvicted": ("test_scan_lists_exactly_what_is_held", "does not hold"),
    "ScanSizesOnDisk": ("test_scan_lists_exactly_what_is_held", "the stored block's length"),
    "TornWrites": ("test_sigkill_at_every_step_of_a_put", "a torn block must be a miss"),
    "TwoStepWrites": ("test_sigkill_at_every_step_of_a_put", "a torn block must be a miss"),
    "CapacityPerInstance": (
        "test_capacity_holds_for_all_instances_together", "for all its instances together"
    ),
    "ClassLevelRecency": (
        "test_another_namespace_uses_nothing_here", "of the same key) refreshed its recency"
    ),
    "CloseClosesAll": ("test_closing_another_instance_leaves_this_one_open", "ClosedError"),
    "CountsEveryNamespace": (
        "test_each_namespace_counts_its_own_bytes", "count the blocks of the instance's own"
    ),
    "EvictionsStayZero": (
        "test_evictions_figure_counts_capacity_evictions", "the figure counts the blocks removed"
    ),
    "GetIsNoUse": ("test_get_is_a_use", "the get did not refresh its recency"),
    "NativeWrites": ("test_sigkill_at_every_step_of_a_put", "0 kill points"),
    "RefusesWithValueError": (
        "test_bad_option_value_raises_config_error_with_key", "ConfigError with key='scan_batch'"
    ),
    "ReportsEvictedLater": (
        "test_evicted_keys_are_not_reported_by_later_puts", "removed by kvtier_evict"
    ),
    "ScanRefreshes": ("test_scan_is_not_a_use", "the scan refreshed its recency"),
    "StoredPutIsNoUse": (
        "test_put_of_a_stored_key_is_a_use", "the put of the stored key did not refresh"
    ),
}

#: Broken backend -> every kit test that fails on it: one check (or one group's
#: checks) catches each bug the spec's newer rules were written against.
CAUGHT_ONLY_AS = {
    "ClaimsShared": {
        "test_a_put_by_one_is_a_hit_for_the_other",
        "test_an_evict_by_one_is_a_miss_for_the_other",
    },
    "KeepsLastRepeated": {"test_repeated_key_in_one_put_stores_the_first"},
    "LookupRefreshes": {"test_lookup_is_not_a_use"},
    "CapacityPerInstance": {"test_capacity_holds_for_all_instances_together"},
    "ClassLevelRecency": {"test_another_namespace_uses_nothing_here"},
    "CloseClosesAll": {"test_closing_another_instance_leaves_this_one_open"},
    "CountsEveryNamespace": {"test_each_namespace_counts_its_own_bytes"},
    "EvictionsStayZero": {"test_evictions_figure_counts_capacity_evictions"},
    "GetIsNoUse": {"test_get_is_a_use"},
    "NativeWrites": {"test_sigkill_at_every_step_of_a_put"},
    "RefusesWithValueError": {"test_bad_option_value_raises_config_error_with_key"},
    "ReportsEvictedLater": {"test_evicted_keys_are_not_reported_by_later_puts"},
    "ScanRefreshes": {"test_scan_is_not_a_use"},
    "StoredPutIsNoUse": {"test_put_of_a_stored_key_is_a_use"},
}

#: The stateful group is slow to shrink a failure, so it runs on its own, below.
FAST_GROUPS = [g for g in GROUPS if g != "stateful"]


def conformance(
    backend: str, tmp_path: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``kvtier conformance`` in a subprocess, as CI would run it; its result and report."""
    report = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS_DIR), *sys.path]))
    env["COLUMNS"] = "200"  # rich wraps table cells to the terminal's width
    proc = subprocess.run(
        [sys.executable, "-c", CLI, backend, "--report", str(report), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    document = json.loads(report.read_text()) if report.exists() else {}
    return proc, document


CLI = "from kvtier.cli.conformance import conformance_command; conformance_command()"


def failed_groups(report: dict[str, Any]) -> set[str]:
    return {name for name, group in report["groups"].items() if group["failed"]}


def test_every_broken_backend_is_listed() -> None:
    assert set(CAUGHT_BY) == set(BROKEN) | set(PLANTED)


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_kit_catches_broken_backend(name: str, tmp_path: Path) -> None:
    # default settings: a check that catches a bug only sometimes is no check
    proc, report = conformance(
        f"{MODULE[name]}:{name}",
        tmp_path,
        "--option", f"dir={tmp_path / 'store'}",
        "--option", "capacity=4MiB",
        *(arg for group in FAST_GROUPS for arg in ("--group", group)),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report["verdict"] == "fail"
    failed = failed_groups(report)
    assert CAUGHT_BY[name] <= failed <= CAUGHT_BY[name] | MAY_ALSO_CATCH.get(name, set()), (
        proc.stdout
    )
    assert "FAIL" in proc.stdout
    if name in CAUGHT_AS:
        test, words = CAUGHT_AS[name]
        failures = [f for g in report["groups"].values() for f in g["failures"]]
        messages = [f["message"] for f in failures if f["test"] == test]
        assert messages, f"{test} did not fail: {[f['test'] for f in failures]}"
        assert words in messages[0], messages[0]
    if name in CAUGHT_ONLY_AS:
        failures = [f for g in report["groups"].values() for f in g["failures"]]
        assert {f["test"] for f in failures} == CAUGHT_ONLY_AS[name], proc.stdout
        # the other new checks ran and passed (shared runs only where it is declared)
        for group in {"recency", "shared"} - CAUGHT_BY[name]:
            counts = report["groups"][group]
            assert not counts["failed"] and (counts["passed"] or group == "shared"), counts
    # the run removed the per-test directories it made, and the store it created
    assert not (tmp_path / "store").exists(), sorted(tmp_path.rglob("*"))[:5]


@pytest.mark.parametrize("name", ["ForgetsOnReopen", "ServesEvicted"])
def test_stateful_group_catches_broken_backend(name: str, tmp_path: Path) -> None:
    proc, report = conformance(
        f"kit_broken_backends:{name}",
        tmp_path,
        "--option", f"dir={tmp_path / 'store'}",
        "--group", "stateful",
        "--setting", "stateful_step_count=15",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert failed_groups(report) == {"stateful"}
    (failure,) = report["groups"]["stateful"]["failures"]
    # Hypothesis shrank the failure to a short sequence of steps
    assert "state = BackendMachine()" in failure["message"]


def test_chain_without_settling_reads_its_writes(tmp_path: Path) -> None:
    proc, report = conformance(
        "kit_targets:ChainBackend",
        tmp_path,
        "--option", f"url=memory://kit-chain-{uuid.uuid4().hex}",
        "--option", "settle=false",
        "--group", "lookup",
    )
    assert report and not failed_groups(report), proc.stdout


def test_fs_with_a_small_capacity_takes_concurrent_puts(tmp_path: Path) -> None:
    proc, report = conformance(
        "fs", tmp_path,
        "--option", f"url=file://{tmp_path}/fs", "--option", "capacity=1MiB",
        "--group", "concurrency",
    )
    assert report and not failed_groups(report), proc.stdout


def test_reference_backend_passes_through_the_cli(tmp_path: Path) -> None:
    proc, report = conformance(
        "kit_broken_backends:DictBackend",
        tmp_path,
        "--option", f"dir={tmp_path / 'store'}",
        "--option", "capacity=4MiB",
        *(arg for group in FAST_GROUPS for arg in ("--group", group)),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["verdict"] == "pass" and report["totals"]["failed"] == 0
    assert not failed_groups(report)
    assert report["groups"]["stateful"]["selected"] is False
    # the every-step crash test says how many kill points it used
    crash = report["groups"]["crash_safety"]
    assert crash["figures"]["kill_points"] > 10 and crash["figures"]["io_calls"] > 10, crash
    assert f"kill_points={crash['figures']['kill_points']}" in proc.stdout


# --- the kit's own wiring ---------------------------------------------------------


def test_groups_do_not_shadow_each_other() -> None:
    """The groups are mixins of one class: a name defined twice would hide a test or helper."""
    owner = {name: "KitBase" for name in vars(KitBase) if not name.startswith("__")}
    for mixin in BackendTests.__mro__[1:]:
        if mixin in (KitBase, object):
            continue
        for name in vars(mixin):
            if name.startswith("__"):
                continue
            assert name not in owner, f"{name} is defined by {owner[name]} and {mixin.__name__}"
            owner[name] = mixin.__name__


def test_every_kit_test_belongs_to_a_group() -> None:
    tests = [name for name in dir(BackendTests) if name.startswith("test_")]
    assert len(tests) > 30
    seen = set()
    for name in tests:
        marks = [m for m in getattr(getattr(BackendTests, name), "pytestmark", [])
                 if m.name == "kvtier_group"]
        assert len(marks) == 1 and marks[0].args[0] in GROUPS, name
        seen.add(marks[0].args[0])
    assert seen == set(GROUPS)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("capacity=64MiB", ("capacity", "64MiB")),
        ("fsync=true", ("fsync", True)),
        ("io_threads=4", ("io_threads", 4)),
        ("url=file:///tmp/kv", ("url", "file:///tmp/kv")),
        ("url=memory://x", ("url", "memory://x")),
        ("storage_options={endpoint_url: http://h:9000}",
         ("storage_options", {"endpoint_url": "http://h:9000"})),
        ("day=2024-01-01", ("day", "2024-01-01")),
        ("empty=", ("empty", "")),
    ],
)
def test_option_values_are_read_as_yaml(text: str, expected: tuple[str, Any]) -> None:
    assert parse_option(text) == expected


def test_option_without_value_is_rejected() -> None:
    with pytest.raises(click.BadParameter, match="KEY=VALUE"):
        parse_option("capacity")


def test_cli_certifies_host_with_a_table_and_report(tmp_path: Path) -> None:
    proc, report = conformance(
        "host", tmp_path, "--option", "capacity=8MiB",
        "--group", "put_get", "--group", "persistence", "--group", "lifecycle",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (report["distribution"], report["version"]) == ("kvtier", kvtier.__version__)
    assert report["contract_version"] == CONTRACT_VERSION
    assert report["verdict"] == "pass" and report["options"] == {"capacity": "8MiB"}
    persistence = report["groups"]["persistence"]
    assert (persistence["passed"], persistence["failed"]) == (0, 0) and persistence["skipped"]
    assert persistence["skip_reasons"] == ["backend 'host' does not declare persistent=True"]
    assert report["groups"]["put_get"]["passed"] > 20
    assert report["groups"]["stateful"]["selected"] is False
    for text in (f"contract {CONTRACT_VERSION}", "kvtier 0.1.0", "persistence", "PASS",
                 "does not declare persistent=True"):
        assert text in proc.stdout, text


def test_cli_hides_secret_options(tmp_path: Path) -> None:
    proc, report = conformance(
        "fs", tmp_path, "--option", f"url=memory://kit-{uuid.uuid4().hex}",
        "--option", "storage_options={auto_mkdir: hunter2}", "--group", "lifecycle",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["options"]["storage_options"] == "***"
    assert "hunter2" not in proc.stdout + json.dumps(report)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no-such-backend"], "cannot load backend 'no-such-backend': unknown backend"),
        (["kit_broken_backends:Nothing"], "has no 'Nothing'"),
        (["host"], "capacity"),  # a required option is missing
        (["host", "--option", "capacity=lots"], "capacity"),
        (["host", "--option", "capacity=1MiB", "--setting", "crash_rounds=many"],
         "crash_rounds takes int"),
    ],
)
def test_cli_refuses_what_it_cannot_load(tmp_path: Path, args: list[str], message: str) -> None:
    proc, report = conformance(args[0], tmp_path, *args[1:])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stdout
    assert report == {}


def test_plugin_registers_the_marker_and_selects_groups(tmp_path: Path) -> None:
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.kvtier_group('put_get')\n"
        "def test_a():\n    pass\n\n"
        "@pytest.mark.kvtier_group('lifecycle')\n"
        "def test_b():\n    pass\n\n"
        "def test_c():\n    pass\n"
    )
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers"]
    run = subprocess.run([*base, "test_marked.py"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0 and "3 passed" in run.stdout, run.stdout + run.stderr
    picked = subprocess.run(
        [*base, "--kvtier-group", "put_get", "test_marked.py"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert "1 passed, 2 deselected" in picked.stdout, picked.stdout + picked.stderr
    wrong = subprocess.run(
        [*base, "--kvtier-group", "nope", "test_marked.py"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert wrong.returncode == 4 and "invalid choice" in wrong.stderr


# --- a backend whose writes are all native says so ------------------------
# NativeWrites writes through libc: the every-step crash test sees no I/O call
# of its puts.  Undeclared, that fails saying how to declare it; declared with
# kit_native_writes (or the kit class's native_writes), the test skips with the
# reason and the random-instants test, which kills inside native calls, passes.
def _crash_safety(name: str, tmp_path: Path) -> tuple[int, str, dict[str, Any]]:
    proc, report = conformance(
        f"kit_planted_backends:{name}", tmp_path,
        "--option", f"dir={tmp_path / 'store'}", "--option", "capacity=4MiB",
        "--group", "crash_safety",
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr, report["groups"]["crash_safety"]


def test_zero_kill_points_undeclared_fail_saying_how_to_declare(tmp_path: Path) -> None:
    code, shown, group = _crash_safety("NativeWrites", tmp_path)
    assert code == 1, shown
    assert [f["test"] for f in group["failures"]] == ["test_sigkill_at_every_step_of_a_put"]
    message = group["failures"][0]["message"]
    assert "0 kill points" in message and "nothing was certified" in message, message
    assert 'declare it with a reason: kit_native_writes = "why"' in message, message
    assert group["figures"]["kill_points"] == 0, group


def test_declared_native_writes_skip_every_step_with_the_reason(tmp_path: Path) -> None:
    code, shown, group = _crash_safety("DeclaresNativeWrites", tmp_path)
    assert code == 0, shown
    assert (group["passed"], group["failed"], group["skipped"]) == (1, 0, 1), group
    (reason,) = group["skip_reasons"]
    assert reason.startswith("0 kill points, the backend's writes are native: "), reason
    assert DeclaresNativeWrites.kit_native_writes in reason, reason
    assert "test_sigkill_at_random_instants_leaves_no_partial_blocks" in reason, reason
    assert group["figures"]["kill_points"] == 0, group
    assert DeclaresNativeWrites.kit_native_writes in shown  # the table prints it


def test_native_writes_declared_without_a_reason_is_refused(tmp_path: Path) -> None:
    code, shown, group = _crash_safety("BlankNativeWrites", tmp_path)
    assert code == 1, shown
    assert [f["test"] for f in group["failures"]] == ["test_sigkill_at_every_step_of_a_put"]
    assert "a declaration of native writes is a sentence" in group["failures"][0]["message"]


class TestNativeWritesDeclaredOnTheKitClass(CrashSafetyTests):
    """The kit class's ``native_writes``, for a backend whose author cannot change it."""

    backend = "kit_planted_backends:NativeWrites"
    native_writes = "the planted backend writes through libc"

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"dir": str(tmp_path / "store"), "capacity": "4MiB"}

    def test_every_step_skips_with_the_class_reason(self, record_property: Any) -> None:
        with pytest.raises(pytest.skip.Exception, match="writes through libc"):
            self.test_sigkill_at_every_step_of_a_put(record_property)
