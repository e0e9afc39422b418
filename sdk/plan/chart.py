"""PNG charts of a plan, when matplotlib is importable (``pip install 'kvtier[bench]'``)."""

from __future__ import annotations

import importlib
from importlib.util import find_spec
from pathlib import Path

from .report import Plan

__all__ = ["chart_missing", "write_chart"]

#: Why no chart can be written where matplotlib is missing.
_MISSING = "matplotlib is not installed (pip install 'kvtier[bench]')"


def chart_missing() -> str | None:
    """Why ``--chart`` cannot write a chart here (checked before a replay), else None."""
    return None if find_spec("matplotlib") is not None else _MISSING


def write_chart(plan: Plan, path: str | Path) -> str | None:
    """Write the curves to ``path``; returns why not (matplotlib missing), else None."""
    try:  # an optional dependency, imported by name: the type checker need not know it
        importlib.import_module("matplotlib").use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return f"{_MISSING}: no chart written"
    caps = [plan.scale(c) for c in plan.capacities]
    refs = plan.ceiling.references or 1
    fig, (hits, writes) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (name, points) in enumerate(plan.curves.items()):
        color = f"C{i}"
        hits.plot(caps, [100 * p.prefix_ratio for p in points], marker="o", color=color,
                  label=name)
        writes.plot(caps, [p.puts for p in points], marker="o", color=color,
                    label=f"{name}: write through")
        writes.plot(caps, [p.evictions for p in points], linestyle="--", color=color,
                    label=f"{name}: write back")
    if plan.belady:
        hits.plot(caps, [100 * h / refs for h in plan.belady], linestyle=":", color="black",
                  label="Belady (block hits, upper bound)")
    hits.axhline(100 * plan.ceiling.prefix_ratio, color="grey", linestyle="--",
                 label="infinite cache")
    for axis in (hits, writes):
        axis.set_xscale("log")
        axis.set_xlabel("capacity (blocks)")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    hits.set_ylabel("prefix hit ratio (%)")
    hits.set_title(Path(plan.trace["source"]).name or "trace")
    writes.set_ylabel("blocks written to the tier below RAM")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
