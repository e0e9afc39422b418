"""``kvtier conformance peer`` against a live ``kvtier serve``, and ``peers`` as one string.

The server keeps only blocks framed by a chain, so the command certifies
``peer`` through a chain of one peer tier and says so, in its output and in
its report; a backend that stores raw bytes is still certified bare.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from peer_server import PeerServer, node_config

from kvtier import Namespace, open_chain
from kvtier.config import load_config
from kvtier.spec import ConfigError

SECRET = secrets.token_hex(16)
CLI = "from kvtier.cli.conformance import conformance_command; conformance_command()"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerServer]:
    root = tmp_path_factory.mktemp("conformance-peer")
    with PeerServer(root, config=node_config(root, ram="64MiB"), secret=SECRET) as server:
        yield server


def conformance(tmp_path: Path, backend: str, *options: str, group: str | None = None) -> tuple[
        subprocess.CompletedProcess[str], dict[str, Any]]:
    """The command in a subprocess, as an operator runs it; its result and JSON report."""
    report = tmp_path / "report.json"
    args = [arg for option in options for arg in ("--option", option)]
    args += ["--group", group] if group else []
    proc = subprocess.run(
        [sys.executable, "-c", CLI, backend, *args, "--report", str(report)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env=dict(os.environ, COLUMNS="200"),
    )
    return proc, (json.loads(report.read_text()) if report.exists() else {})


def test_conformance_of_peer_runs_through_a_chain_and_passes(
    node: PeerServer, tmp_path: Path
) -> None:
    proc, report = conformance(tmp_path, "peer", f"peers={node.address}", f"secret={SECRET}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "stores only blocks framed by a chain" in proc.stdout
    assert "through a chain of one tier" in proc.stdout
    assert report["verdict"] == "pass" and report["through_chain"] is True
    assert report["backend"] == "peer"
    assert report["options"] == {"peers": node.address, "secret": "***"}
    totals = report["totals"]
    assert totals["failed"] == 0 and totals["passed"] >= 40, totals
    for group in ("put_get", "lookup", "evict", "concurrency", "stateful", "lifecycle", "shared",
                  "expire", "deadlines"):
        assert report["groups"][group]["passed"] > 0, group
    # the declaration itself is checked on the backend, not through the chain
    assert report["groups"]["framed"]["passed"] == 2, report["groups"]["framed"]
    assert SECRET not in proc.stdout + proc.stderr


def test_conformance_of_a_raw_backend_stays_bare(tmp_path: Path) -> None:
    proc, report = conformance(tmp_path, "host", "capacity=4MiB", group="lookup")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert report["through_chain"] is False
    assert "framed by a chain" not in proc.stdout


def test_wrong_secret_still_fails(node: PeerServer, tmp_path: Path) -> None:
    """Going through a chain hides nothing: a server that refuses us is a failure."""
    proc, report = conformance(tmp_path, "peer", f"peers={node.address}", "secret=wrong",
                                group="put_get")
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert report["verdict"] == "fail" and report["totals"]["failed"] > 0


# --- peers: one string where a list is expected -----------------------------------------

def peers_of(value: Any) -> Any:
    config = load_config({"chain": [{"name": "p", "backend": "peer", "peers": value}]})
    return config.tiers[0].options["peers"]


@pytest.mark.parametrize(("value", "expected"), [
    ("127.0.0.1:7077", ["127.0.0.1:7077"]),
    ("a:1,b:2", ["a:1", "b:2"]),
    (" a:1 , b:2 ,", ["a:1", "b:2"]),
    (["a:1", "b:2"], ["a:1", "b:2"]),
])
def test_peers_accepts_one_string(value: Any, expected: list[str]) -> None:
    assert peers_of(value) == expected


@pytest.mark.parametrize(("value", "reason"), [
    ("", "non-empty"),
    ("nohostport", "HOST:PORT"),
    ("a:1,a:1", "more than once"),
    ({"a": 1}, "expected a list"),
])
def test_bad_peers_strings_are_config_errors(value: Any, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        peers_of(value)


def test_chain_with_peers_as_one_string_reaches_the_server(node: PeerServer) -> None:
    tier = {"name": "p", "backend": "peer", "peers": node.address, "secret": SECRET}
    namespace = Namespace("peers-string", dtype="bfloat16", tokens_per_block=32)
    block = os.urandom(4096)
    with open_chain({"chain": [tier]}, namespace=namespace) as chain:
        assert chain.put([b"k1"], [block]) == [True]
    with open_chain({"chain": [tier]}, namespace=namespace) as chain:
        assert chain.get_bytes([b"k1", b"k2"]) == [block, None]
