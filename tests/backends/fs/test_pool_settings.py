"""What processes sharing an ``fs`` pool report, and which settings they must share.

Real processes (tests/support/fs_pool_child.py) on one root; no mocks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from fs_blocks import NS, files_on_disk
from fs_pool_child import block, open_backend

import kvtier
from kvtier.backends.fs.pool import DB_NAME
from kvtier.cli import cli
from kvtier.spec import ConfigError

CHILD = Path(__file__).parents[2] / "support" / "fs_pool_child.py"
OTHER_NS = "fedcba9876543210fedcba9876543210"
KiB, MiB = 1 << 10, 1 << 20


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(CHILD), json.dumps(spec)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_figures_are_the_pool_s_beside_the_process_s_own_share(tmp_path: Path) -> None:
    root, cap, size = tmp_path / "pool", 1 * MiB, 16 * KiB
    opts = {"capacity": cap, "capacity_scope": "pool"}
    tier = open_backend({"url": str(root), "namespace": NS, "options": opts})
    try:
        mine = [f"m{i}".encode() for i in range(200)]  # 3.1 MiB into 1 MiB
        for key in mine[:100]:
            assert list(tier.put([key], [block(key, size)], [])) == [True]
        # another process writes as much into another namespace of the root
        theirs = run_child({"mode": "write", "url": str(root), "namespace": OTHER_NS,
                            "size": size, "count": 200, "writers": 1, "writer": 0,
                            "options": opts})
        assert theirs["stored"] == 200
        for key in mine[100:]:
            assert list(tier.put([key], [block(key, size)], [])) == [True]
        stats = tier.stats()
        own = tier.instance._capacity.pool.me
        # this process's own index of the namespace keeps no more than the pool can hold
        # (it kept an entry for every block it ever stored), and forgets nothing it needs
        ledger = tier.instance._ledger
        assert ledger.used <= cap and len(ledger.index) <= cap // size
        held = files_on_disk(root, NS)
        assert list(tier.lookup(list(held))) == [True] * len(held)
        for key, data in zip(held, tier.get(list(held)), strict=True):
            assert data is not None and bytes(data) == block(key, size)
    finally:
        tier.close()
    held = {ns: files_on_disk(root, ns) for ns in (NS, OTHER_NS)}
    on_disk = sum(sum(files.values()) for files in held.values())
    # the pool's truth: what the index counts, which is what the files hold
    assert stats["used_bytes"] == on_disk <= cap
    assert stats["blocks"] == sum(len(files) for files in held.values())
    assert stats["capacity_bytes"] == cap
    # this process's own share: its blocks still held, whoever evicted the others
    with sqlite3.connect(root / DB_NAME) as db:
        rows = dict(db.execute("SELECT key, size FROM blocks WHERE ns = ? AND writer = ?",
                               (NS, own)).fetchall())
    assert rows == held[NS] and held[NS]
    assert stats["own_blocks"] == len(held[NS])
    assert stats["own_used_bytes"] == sum(held[NS].values()) < 200 * size
    # the other process reported the same pool and its own share when it closed
    assert theirs["used_bytes"] <= cap and theirs["own_used_bytes"] <= theirs["used_bytes"]


def test_a_capacity_other_than_the_pool_s_is_refused_while_it_is_held(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    opts = {"capacity": "2MiB", "capacity_scope": "pool"}
    first = open_backend({"url": str(root), "namespace": NS, "options": opts})
    try:
        with pytest.raises(ConfigError) as refused:
            open_backend({"url": str(root), "namespace": OTHER_NS,
                          "options": {**opts, "capacity": "8MiB"}})
        assert refused.value.key == "capacity"
        message = str(refused.value)
        assert "2097152 bytes (2.0 MiB)" in message and "8388608 bytes (8.0 MiB)" in message
        assert f"pids {os.getpid()}" in message
        # the same capacity is welcome, in any namespace of the root
        same = open_backend({"url": str(root), "namespace": OTHER_NS, "options": opts})
        same.close()
    finally:
        first.close()
    # nobody holds it open: the next process resizes it, and holds the new capacity
    bigger = open_backend({"url": str(root), "namespace": NS,
                           "options": {**opts, "capacity": "8MiB"}})
    try:
        assert bigger.stats()["capacity_bytes"] == 8 * MiB
        with pytest.raises(ConfigError, match="asks for 2097152 bytes"):
            open_backend({"url": str(root), "namespace": NS, "options": opts})
    finally:
        bigger.close()


def test_a_dead_process_holds_no_pool_open(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    opts = {"capacity": "2MiB"}
    code = ("import json, sys, time; sys.path.insert(0, sys.argv[1]); "
            "from fs_pool_child import open_backend; "
            "open_backend(json.loads(sys.argv[2])); print('open', flush=True); time.sleep(600)")
    spec = {"url": str(root), "namespace": NS, "options": opts}
    holder = subprocess.Popen([sys.executable, "-c", code, str(CHILD.parent), json.dumps(spec)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "open"
    with pytest.raises(ConfigError, match=f"pids {holder.pid}"):
        open_backend({**spec, "options": {"capacity": "4MiB"}})
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    resized = open_backend({**spec, "options": {"capacity": "4MiB"}})
    try:
        assert resized.stats()["capacity_bytes"] == 4 * MiB
    finally:
        resized.close()


@pytest.mark.parametrize("lease", ["0s", "500ms", 0.999])
def test_a_lease_below_the_floor_is_refused(tmp_path: Path, lease: Any) -> None:
    with pytest.raises(ConfigError) as refused:
        open_backend({"url": str(tmp_path), "namespace": NS,
                      "options": {"capacity": "1MiB", "pool_lease": lease}})
    assert refused.value.key == "pool_lease"
    assert "expected at least 1s" in str(refused.value)
    assert not (tmp_path / DB_NAME).exists()  # refused before anything was written
    tier = open_backend({"url": str(tmp_path), "namespace": NS,
                         "options": {"capacity": "1MiB", "pool_lease": "1s"}})
    tier.close()


def test_prometheus_exports_the_pool_s_bytes_and_the_process_s_own(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    root, size = tmp_path / "pool", 16 * KiB
    config = {"chain": [{"name": "disk", "backend": "fs", "url": str(root), "capacity": "1MiB",
                         "capacity_scope": "pool", "direct_io": False}],
              "metrics": {"prometheus_port": port}}
    namespace = kvtier.Namespace("figures", dtype="bfloat16", tokens_per_block=16)
    keys = [f"k{i}".encode() for i in range(200)]  # 3.1 MiB into 1 MiB
    with kvtier.open_chain(config, namespace=namespace) as chain:
        for key in keys:
            assert chain.put([key], [block(key, size)]) == [True]
        stats = chain.stats()["tiers"][0]["backend_stats"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        # the pool's bytes (this namespace's blocks and the catalog's descriptor) while the
        # chain is open: its close rewrites the descriptor with what it learned of the tier
        # (a read-back's load cost), a few bytes more
        held = sum(sum(files_on_disk(root, ns).values()) for ns in os.listdir(root)
                   if (root / ns).is_dir())
    labels = f'backend="fs",namespace="{namespace.hex}",tier="disk"'
    exported = {name: float(value) for name, value in re.findall(
        rf"^(kvtier_tier_\w+)\{{{re.escape(labels)}\}} (\S+)$", text.decode(), re.M)}
    assert exported["kvtier_tier_used_bytes"] == stats["used_bytes"] == held <= MiB
    assert exported["kvtier_tier_own_used_bytes"] == stats["own_used_bytes"] > 0
    assert exported["kvtier_tier_own_blocks"] == stats["own_blocks"] > 0


def test_the_pool_knows_the_chain_s_catalog() -> None:
    from kvtier.backends.fs.pool_policy import CATALOG_NS
    from kvtier.chain.catalog import CATALOG_HEX

    assert CATALOG_NS == CATALOG_HEX  # the descriptors it keeps are the chain's


@pytest.mark.parametrize(("value", "floor"), [(4096, (4096, 0.0)), ("4KiB", (4096, 0.0)),
                                              ("10%", (0, 0.1))])
def test_min_free_takes_a_size_as_every_size_does(tmp_path: Path, tmpfs: Path, value: Any,
                                                   floor: tuple[int, float]) -> None:
    # On a 16 MiB tmpfs: a floor of 10% of the host's disk would refuse the put whenever
    # that disk is nearly full, which says nothing about how the setting is read.
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump({"chain": [{"name": "disk", "backend": "fs",
                                               "url": str(tmpfs / "store"),
                                               "min_free": value}]}))
    checked = CliRunner().invoke(cli, ["config", "validate", str(path)])
    assert checked.exit_code == 0, checked.output
    namespace = kvtier.Namespace("floor", dtype="bfloat16", tokens_per_block=16)
    with kvtier.open_chain(str(path), namespace=namespace) as chain:
        assert chain.put([b"k"], [b"v" * 1024]) == [True]
        assert chain.tiers[0].handle.instance._capacity.pool.floor == floor


@pytest.mark.parametrize("value", [0, -1, "0%", "100%", True, 1.5, "nan"])
def test_min_free_refuses_what_is_no_floor(tmp_path: Path, value: Any) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump({"chain": [{"name": "disk", "backend": "fs",
                                               "url": str(tmp_path / "store"),
                                               "min_free": value}]}))
    checked = CliRunner().invoke(cli, ["config", "validate", str(path)])
    assert checked.exit_code == 2 and "min_free" in checked.output, checked.output
    assert "Traceback" not in checked.output


def test_a_block_an_evict_cannot_delete_stays_counted(tmp_path: Path) -> None:
    root, size = tmp_path / "pool", 4 * KiB
    tier = open_backend({"url": str(root), "namespace": NS, "options": {"capacity": "1MiB"}})
    try:
        keys = [b"a", b"b"]
        assert list(tier.put(keys, [block(k, size) for k in keys], [])) == [True, True]
        stuck = tier.instance._store.path(b"a")
        made = subprocess.run(["chattr", "+i", stuck], capture_output=True, check=False)
        if made.returncode:
            pytest.skip(f"chattr +i refused here: {made.stderr.decode().strip()}")
        try:
            assert list(tier.evict(keys)) == [False, True]  # a fault of that file: kept
            stats = tier.stats()
        finally:
            subprocess.run(["chattr", "-i", stuck], check=True)
    finally:
        tier.close()
    assert files_on_disk(root, NS) == {b"a": size}
    # the file that stayed is counted: the pool's row went before the deletion failed
    with sqlite3.connect(root / DB_NAME) as db:
        assert db.execute("SELECT key, size FROM blocks").fetchall() == [(b"a", size)]
        assert db.execute("SELECT bytes FROM totals WHERE scope = ?", (NS,)).fetchone() == (size,)
    assert (stats["used_bytes"], stats["blocks"]) == (size, 1)
