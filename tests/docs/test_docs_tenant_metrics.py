"""docs/tenants.md's per-tenant metrics are what the Prometheus endpoint exports (name, type)."""

from __future__ import annotations

import re
import socket
import urllib.request
from pathlib import Path

import yaml

from kvtier.chain.tenants import open_tenants
from kvtier.config import load_config

DOC = (Path(__file__).parents[2] / "docs" / "tenants.md").read_text()
SECTION = DOC.split("## Per-tenant figures (available)\n", 1)[1].split("\n## ", 1)[0]
ROW = re.compile(r"^\| `(kvtier_\w+)` \| (counter|gauge) \| [^|]+ \|$", re.M)
TYPE = re.compile(r"^# TYPE (kvtier_tenants?_\w+) (counter|gauge)$", re.M)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_documented_metrics_are_the_exported_ones() -> None:
    documented = dict(ROW.findall(SECTION))
    assert len(documented) == 9
    port = free_port()
    cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}],
           "metrics": {"prometheus_port": port, "tenants_top": 1}}
    with open_tenants(cfg, "llama") as tenants:
        tenants.chain("acme").put([b"a"], [b"x" * 100])
        tenants.chain("globex").put([b"a"], [b"y" * 10])
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    exported = {}
    for name, kind in TYPE.findall(text.decode()):  # a counter's samples end in _total
        counter = kind == "counter" and not name.endswith("_total")
        exported[f"{name}_total" if counter else name] = kind
    samples = set(re.findall(r"^(kvtier_tenants?_\w+)\{", text.decode(), re.M))
    assert samples == set(documented)
    assert exported == documented
    assert 'tenant="other"' in text.decode() and 'tenant="acme"' in text.decode()


def test_the_documented_metrics_section_validates() -> None:
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", SECTION, flags=re.S)]
    metrics = yaml.safe_load(block)["metrics"]
    config = load_config({"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}],
                          "metrics": metrics})
    assert (config.metrics.tenants_top, config.metrics.tenants_interval) == (20, 60.0)
