"""A fault of one block file is a miss of that block; a fault of the tier backs it off.

The rule is in kvtier.backends.fs.faults and docs/reliability.md.  The
permission faults are real: each scenario runs in a child process
(tests/support/fs_fault_child.py) without DAC override, so that file modes
stop it although the tests run as root.  EIO is simulated on the store.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from fs_blocks import Opener, as_bytes, blob
from fs_fault_child import file_of, keys, open_chain, payload, without_dac

from kvtier.backends.fs.local import LocalStore
from kvtier.spec import BackendError

CHILD = Path(__file__).parents[2] / "support" / "fs_fault_child.py"


def run_child(mode: str, directory: Path) -> dict[str, Any]:
    """The child's report (see its docstring for the modes)."""
    proc = without_dac([sys.executable, str(CHILD), mode, str(directory)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(report["skip"])
    return report


def test_one_unreadable_file_in_a_batch_of_20_is_one_miss(tmp_path: Path) -> None:
    seen = run_child("read", tmp_path / "store")
    expected = [i != 7 for i in range(20)]
    # every batch serves the 19 intact blocks byte for byte, the tier stays up
    assert seen["batches"] == [expected] * 3
    assert seen["singles"] == expected
    assert seen["again"] == expected
    assert seen["lookup"] == [0] * 20  # the file is there: its read is what fails
    assert seen["errors"] == 0 and seen["healthy"] is True
    assert seen["block_faults"] == 5  # three batches, one single read, the last batch
    assert seen["hits"] == 19 * 5 and seen["misses"] == 5


def test_one_unwritable_file_fails_only_its_own_store(tmp_path: Path) -> None:
    seen = run_child("write", tmp_path / "store")
    expected = [i != 5 for i in range(16)]
    assert seen["concurrent"] == expected  # 16 stores at the same time
    assert seen["batch"] == expected  # and one batch of 16
    assert seen["after"] == [True]  # no back-off after either
    assert seen["read_back"] == [True] * 30
    assert seen["errors"] == 0 and seen["healthy"] is True
    assert seen["block_faults"] == 2
    assert seen["failed"] == 0 and seen["refused"] == 2


def test_an_unremovable_victim_does_not_stop_writes(tmp_path: Path) -> None:
    seen = run_child("evict", tmp_path / "store")
    assert seen["stored"] == [True] * 4
    # the last three read back; the first may be pushed out in turn where the
    # stuck file's bytes still count against the capacity
    assert seen["read_back"][1:] == [True] * 3
    assert seen["errors"] == 0 and seen["healthy"] is True
    # the stuck file stays counted (kvtier.backends.fs.pool): it is tried again, and
    # faults again, each time it is the least recently used once more
    assert seen["block_faults"] >= 1


def test_an_unreachable_root_still_backs_the_tier_off(tmp_path: Path) -> None:
    seen = run_child("root", tmp_path / "store")
    assert seen["first"] == [False] * 20 and seen["second"] == [False] * 20
    assert seen["after_first"]["errors"] == 1 and seen["after_first"]["healthy"] is False
    assert seen["errors"] == 1  # the second batch was not even tried
    assert seen["block_faults"] == 0


# ---------------------------------------------------------------------------
# EIO, on the store (a bad sector cannot be made on demand)
# ---------------------------------------------------------------------------


def _eio(*_: Any) -> Any:
    raise OSError(errno.EIO, os.strerror(errno.EIO))


def test_eio_on_one_file_is_a_miss(
    local_url: str, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = opener(local_url)
    keys = [bytes([i, 1]) for i in range(8)]
    assert all(tier.put(keys, [blob(100, i) for i in range(8)], []))
    read = LocalStore.read
    monkeypatch.setattr(LocalStore, "read",
                        lambda self, key: _eio() if key == keys[3] else read(self, key))
    got = tier.get(keys)
    assert [as_bytes(g) for g in got] == [None if i == 3 else blob(100, i) for i in range(8)]
    assert tier.get([keys[3]]) == [None]
    assert tier.stats()["block_faults"] == 2
    monkeypatch.undo()
    assert as_bytes(tier.get([keys[3]])[0]) == blob(100, 3)  # kept: it was a fault, not a loss


def test_eio_on_every_file_and_the_root_is_the_tiers(
    local_url: str, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = opener(local_url)
    keys = [bytes([i, 2]) for i in range(4)]
    assert all(tier.put(keys, [blob(100, i) for i in range(4)], []))
    monkeypatch.setattr(LocalStore, "read", lambda self, key: _eio())
    monkeypatch.setattr(LocalStore, "probe_read", lambda self: _eio())
    for batch in (keys, keys[:1]):
        with pytest.raises(BackendError) as info:
            tier.get(batch)
        assert info.value.errno == errno.EIO
    assert tier.stats()["block_faults"] == 0


def test_scrub_lists_an_unreadable_file_and_goes_on(tmp_path: Path) -> None:
    directory = str(tmp_path / "store")
    ks = keys(20)
    with open_chain(directory) as chain:
        assert chain.put(ks, [payload(i) for i in range(20)]) == [True] * 20
    config = tmp_path / "chain.yaml"
    config.write_text(f"chain:\n  - {{name: disk, backend: fs, url: '{directory}'}}\n")
    file_of(directory, ks[7]).chmod(0)
    proc = without_dac([sys.executable, "-m", "kvtier.cli", "scrub", str(config), "--json"])
    assert proc.returncode == 1, proc.stderr[-3000:]  # a problem found; 2 was "stopped"
    report = json.loads(proc.stdout)
    (tier,) = report["tiers"]
    # 19 blocks and the catalog's descriptor checked, the unreadable one listed
    assert [u["key"] for u in tier["unreadable"]] == [ks[7].hex()]
    assert report["unreadable"] == 1 and tier["corrupt"] == [] and tier["vanished"] == 0
    assert tier["checked"] == 20  # the 19 others and the catalog's descriptor
