"""``kvtier inspect --metrics URL`` shows the online sizing a serving chain exports, per tier."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import yaml
from click.testing import CliRunner

import kvtier
from kvtier.cli import cli

NS = kvtier.Namespace(model="inspect-sizing", dtype="bfloat16", tokens_per_block=16)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_inspect_shows_each_tiers_estimates_from_the_serving_chain(tmp_path: Path) -> None:
    port = free_port()
    config = {
        "chain": [
            {"name": "ram", "backend": "host", "capacity": "8KiB", "sizing_sample": 1},
            {"name": "disk", "backend": "fs", "url": str(tmp_path / "store"),
             "capacity": "16KiB", "sizing_sample": 1},
            {"name": "spare", "backend": "fs", "url": str(tmp_path / "spare")},
        ],
        "metrics": {"prometheus_port": port},
    }
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}/metrics"
    keys = [b"block-%d" % i for i in range(24)]
    with kvtier.open_chain(str(path), namespace=NS) as chain:
        for _ in range(3):  # 24 blocks of 1 KiB: some fit in each tier's miniatures
            chain.get(keys, [bytearray(1024) for _ in keys])
            chain.put(keys, [bytes([i]) * 1024 for i in range(24)])
            chain.flush()  # the disk tier's copies land before the next gets
        stats = {tier["name"]: tier["backend_stats"] for tier in chain.stats()["tiers"]}
        result = CliRunner().invoke(cli, ["inspect", str(path), "--json", "--metrics", url])
        tables = CliRunner().invoke(cli, ["inspect", str(path), "--metrics", url])
    assert result.exit_code == 0, result.output
    rows = {row["tier"]: row for row in json.loads(result.output)["tiers"]}
    assert "skipped" in rows["ram"]  # RAM holds nothing inspect can list, yet it estimates
    for name in ("ram", "disk"):
        (live,) = rows[name]["sizing"]
        assert live["metrics"] == url and live["namespace"] == NS.hex
        assert live["hit_ratio"] == {f"{m}x": stats[name][f"sizing_hit_ratio_{m}x"]
                                     for m in ("0.5", "1", "2", "4")}
    assert rows["disk"]["sizing"][0]["hit_ratio"]["4x"] > 0
    assert rows["spare"]["sizing"] == []  # no capacity: it never evicts, nothing to estimate
    assert tables.exit_code == 0, tables.output
    assert f"online sizing, {url}, namespace {NS.hex[:12]}: hit ratio at 0.5x " in tables.output
    assert "online sizing: none exported for this tier" in tables.output


def test_inspect_fails_on_an_endpoint_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump({"chain": [{"name": "disk", "backend": "fs",
                                               "url": str(tmp_path)}]}))
    url = f"http://127.0.0.1:{free_port()}/metrics"
    result = CliRunner().invoke(cli, ["inspect", str(path), "--metrics", url])
    assert result.exit_code == 2 and f"--metrics {url}:" in result.output
