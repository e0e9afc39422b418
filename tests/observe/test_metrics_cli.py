"""Metrics leave the process (Prometheus, log lines); the config commands report precisely."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvtier import open_chain
from kvtier.observe.metrics import summary_line


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_prometheus_endpoint_exports_tier_counters() -> None:
    port = free_port()
    cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}],
           "metrics": {"prometheus_port": port}}
    with open_chain(cfg, namespace="metrics-test") as chain:
        chain.put([b"a", b"b"], [b"x" * 100, b"y" * 50])
        chain.get([b"a", b"zz"], [bytearray(100), bytearray(100)])
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        text = body.decode()
        ns = chain.namespace.hex
        labels = f'backend="host",namespace="{ns}",tier="ram"'
        assert f"kvtier_tier_hits_total{{{labels}}} 1.0" in text
        assert f"kvtier_tier_misses_total{{{labels}}} 1.0" in text
        assert f"kvtier_tier_written_bytes_total{{{labels}}} 150.0" in text
        assert f"kvtier_tier_healthy{{{labels}}} 1.0" in text
        assert f"kvtier_tier_used_bytes{{{labels}}}" in text
    # a closed chain is no longer exported
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert ns not in text


def test_prometheus_endpoint_listens_on_this_host_only_unless_told() -> None:
    from kvtier.observe.metrics import _exporters

    port = free_port()
    cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}],
           "metrics": {"prometheus_port": port}}
    with open_chain(cfg, namespace="metrics-host-test"):
        assert _exporters[("127.0.0.1", port)].server.server_address[:2] == ("127.0.0.1", port)
    other = free_port()
    cfg["metrics"] = {"prometheus_port": other, "prometheus_host": "127.0.0.2"}
    with open_chain(cfg, namespace="metrics-host-test"):
        server = _exporters[("127.0.0.2", other)].server
        assert server.server_address[:2] == ("127.0.0.2", other)
        body = urllib.request.urlopen(f"http://127.0.0.2:{other}/metrics", timeout=10).read()
        assert b"kvtier_tier_hits_total" in body


def test_prometheus_endpoint_exports_online_sizing_per_scale() -> None:
    """Each tier's sizing_hit_ratio_<m>x is a gauge labelled by scale, the stats' own value."""
    port = free_port()
    cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "4KiB", "sizing_sample": 1},
                     {"name": "off", "backend": "host", "capacity": "4KiB", "sizing_sample": 0}],
           "metrics": {"prometheus_port": port}}
    with open_chain(cfg, namespace="sizing-metrics-test") as chain:
        keys = [bytes([i]) for i in range(12)]
        for _ in range(3):  # 12 blocks of 512 B: 8 fit at 1x, all of them at 2x
            chain.get(keys, [bytearray(512) for _ in keys])
            chain.put(keys, [bytes([i]) * 512 for i in range(12)])
        stats = chain.stats()["tiers"][0]["backend_stats"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        ns = chain.namespace.hex
    exported = {}
    for line in text.decode().splitlines():
        if line.startswith("kvtier_tier_sizing_hit_ratio{"):
            labels, value = line.split("} ")
            exported[labels.split("{")[1]] = float(value)
    expected = {f'backend="host",namespace="{ns}",scale="{m}x",tier="ram"':
                stats[f"sizing_hit_ratio_{m}x"] for m in ("0.5", "1", "2", "4")}
    assert exported == expected  # the tier with sizing off exports none
    assert expected[f'backend="host",namespace="{ns}",scale="2x",tier="ram"'] > 0


def test_log_line_every_interval(caplog: pytest.LogCaptureFixture) -> None:
    cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}],
           "metrics": {"log_interval": "50ms"}}
    with (
        caplog.at_level(logging.INFO, logger="kvtier.observe.metrics"),
        open_chain(cfg, namespace="log-test") as chain,
    ):
        chain.put([b"a"], [b"x" * 10])
        chain.get([b"a"], [bytearray(10)])
        deadline = time.monotonic() + 10
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.02)
        expected = summary_line(chain.stats())
    assert any(r.getMessage() == expected for r in caplog.records)
    assert "ram: 1 hit 0 miss 10 B out 10 B in" in expected


def kvtier(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtier.cli", *args], capture_output=True,
                          text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


GOOD = """\
chain:
  - name: ram
    backend: host
    capacity: 8GiB
    eviction: arc
  - name: disk
    backend: fs
    url: file:///tmp/kvtier-cli-test
    write: back
"""


def test_config_validate_ok_and_explain_table(tmp_path: Path) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text(GOOD)
    ok = kvtier("config", "validate", str(path))
    assert ok.returncode == 0 and f"{path}: OK, 2 tier(s): ram -> disk" in ok.stdout
    explained = kvtier("config", "explain", str(path))
    assert explained.returncode == 0, explained.stderr
    rows = [[c.strip() for c in line.split("│")[1:-1]]
            for line in explained.stdout.splitlines() if line.startswith("│")]
    assert ["ram", "eviction", "arc", "file", "5"] in rows
    assert ["disk", "write", "back", "file", "9"] in rows
    assert ["disk", "verify", "true", "default", "-"] in rows


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace("8GiB", "8 gigs"), ":4: chain[0].capacity: expected a size"),
        (GOOD.replace("eviction: arc", "eviction: fifo"), ":5: chain[0].eviction:"),
        (GOOD.replace("backend: fs", "backend: nfs"), "unknown backend 'nfs'"),
        (GOOD.replace("write: back", "writes: back"), ":9: chain[1].writes:"),
    ],
)
def test_config_validate_names_file_line_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text(text)
    result = kvtier("config", "validate", str(path))
    assert result.returncode == 2
    assert str(path) in result.stderr and message in " ".join(result.stderr.split())
