"""docs/load-policy.md's "What the dashboards show" names every figure of the load decision
that a chain exports (``stats()``, the Prometheus endpoint, events), and exports each it names."""

from __future__ import annotations

import dataclasses
import re
import socket
import urllib.request
from pathlib import Path
from typing import Any

import kvtier
from kvtier.chain import ChainEvent
from kvtier.chain.cost import LoadDecision
from kvtier.config.load_policy import LoadConfig
from kvtier.observe.metrics import COUNTERS

DOC = (Path(__file__).parents[2] / "docs" / "load-policy.md").read_text()
SECTION = DOC.split("## What the dashboards show\n", 1)[1].split("\n## ", 1)[0]
BULLETS = SECTION.split("\n* ")[1:]
TYPE = re.compile(r"^# TYPE (kvtier_\w+) (counter|gauge)$", re.M)
#: The load decision's gauges (the counters are :data:`COUNTERS` of ``tier_stats``' keys).
GAUGES = re.compile(r"^kvtier_(recompute_\w+|tier_block_load_seconds|tier_load_samples)$")
NS = kvtier.Namespace("docs-load-policy", dtype="bfloat16", tokens_per_block=16)


def _named(start: str) -> set[str]:
    """The names the section's bullet that begins with ``start`` writes as code."""
    (bullet,) = (b for b in BULLETS if b.startswith(start))
    return set(re.findall(r"`([A-Za-z_]\w*)`", bullet))


def _scrape() -> tuple[dict[str, Any], str]:
    """A chain with a configured model whose one tier was measured by a load: its stats,
    and its endpoint's exposition."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    config = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}],
              "recompute": "1ms/token", "metrics": {"prometheus_port": port}}
    with kvtier.open_chain(config, NS) as chain:
        assert chain.put([b"a"], [b"x" * 1024]) == [True]
        out = [bytearray(1024)]
        assert chain.get([b"a"], out) == [True] and bytes(out[0]) == b"x" * 1024
        stats = chain.stats()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=10).read().decode()
    return stats, text


def test_every_load_figure_of_stats_is_documented() -> None:
    stats, _ = _scrape()
    named = _named("`Chain.stats()`")
    per_tier = LoadDecision(LoadConfig(), 1, 16).tier_stats(0)
    assert stats["tiers"][0]["load_cost"]["measured"] is True
    figures = {"load_policy", "recompute", *stats["recompute"], *per_tier,
               *stats["tiers"][0]["load_cost"]}
    assert figures - named == set()


def test_the_documented_prometheus_figures_are_the_exported_ones() -> None:
    _, text = _scrape()
    exported = {f"{name}_total" if kind == "counter" and not name.endswith("_total") else name
                for name, kind in TYPE.findall(text)}  # a counter's samples end in _total
    per_tier = LoadDecision(LoadConfig(), 1, 16).tier_stats(0)
    load_figures = {f"kvtier_tier_{name}_total" for key, name, _ in COUNTERS if key in per_tier}
    load_figures |= {name for name in exported if GAUGES.match(name)}
    documented = {name for name in _named("Prometheus") if name.startswith("kvtier_")}
    assert documented - exported == set()  # documented, not exported
    assert load_figures - documented == set()  # exported, not documented
    assert len(documented) == 10


def test_every_figure_an_event_carries_is_documented() -> None:
    what = {"kind", "tier", "tier_index", "keys", "reason"}  # which blocks moved where
    figures = {f.name for f in dataclasses.fields(ChainEvent)} - what
    assert figures == {"load_s", "recompute_s", "recompute_source", "recompute_samples",
                       "load_source"}
    assert figures - _named("Events") == set()
