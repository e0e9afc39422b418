"""A plan: curves of every policy at every capacity, the bounds, and a chain to paste."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from .below import BELOW_EVICTIONS, BelowPoint
from .curves import Point, belady_hits, infinite_point, lru_curve, replay
from .trace import Trace

__all__ = ["Plan", "default_capacities", "describe", "disk_admission", "disk_eviction",
           "make_plan", "recommend"]

#: The fs tier below RAM is sized to keep this share of the ceiling's prefix hits.
DISK_SHARE = 0.95
#: Without a RAM budget, RAM is sized to keep this share of them.
RAM_SHARE = 0.5


@dataclass
class Plan:
    """Everything ``kvtier plan`` reports; capacities are in blocks of the replayed trace."""

    trace: dict[str, Any]
    block_bytes: int
    capacities: list[int]
    ceiling: Point
    curves: dict[str, list[Point]]
    belady: list[int] = field(default_factory=list)  # block hits at each capacity
    ram_blocks: int | None = None  # the operator's RAM budget, in blocks of the trace
    #: The --below replays: RAM over a tier below, by admission and by the tier below's
    #: policy (see disk_eviction and disk_admission).
    below: list[BelowPoint] = field(default_factory=list)

    def scale(self, capacity: int) -> int:
        """Blocks of the full traffic a capacity of the (sampled) trace stands for."""
        return round(capacity / (self.trace["sample"] or 1.0))

    def to_json(self) -> dict[str, Any]:
        refs = self.ceiling.references
        rows = {
            name: [{**asdict(p), "capacity_full": self.scale(p.capacity),
                    "prefix_ratio": p.prefix_ratio} for p in points]
            for name, points in self.curves.items()
        }
        return {
            "trace": self.trace,
            "block_bytes": self.block_bytes,
            "capacities": self.capacities,
            "ceiling": {**asdict(self.ceiling), "prefix_ratio": self.ceiling.prefix_ratio},
            "curves": rows,
            "belady": [{"capacity": c, "block_hits": h, "block_ratio": h / refs if refs else 0.0}
                       for c, h in zip(self.capacities, self.belady, strict=False)],
            "recommended": recommend(self),
        }


def describe(trace: Trace) -> dict[str, Any]:
    """The trace's line in a plan: where from, its size, and the sample it holds."""
    return {"source": trace.source, "requests": len(trace.requests),
            "references": trace.references, "unique_blocks": trace.unique_blocks,
            "block_tokens": trace.block_tokens, "sample": trace.sample}


def default_capacities(unique: int, points: int = 8) -> list[int]:
    """``points`` capacities from 1% to 100% of the unique blocks, evenly on a log scale."""
    if unique <= 0:
        return [1]
    low = max(1, unique // 100)
    caps = {round(low * (unique / low) ** (i / max(1, points - 1))) for i in range(points)}
    return sorted(max(1, c) for c in caps)


def make_plan(
    trace: Trace,
    policies: Sequence[str],
    capacities: Sequence[int],
    block_bytes: int,
    belady: bool = True,
    ram_blocks: int | None = None,
) -> Plan:
    caps = sorted({*capacities, *([ram_blocks] if ram_blocks else [])})
    curves: dict[str, list[Point]] = {}
    for name in policies:
        curves[name] = lru_curve(trace, caps) if name == "lru" else [
            replay(trace, name, cap) for cap in caps
        ]
    info = describe(trace)
    ceiling = infinite_point(trace)
    hits = [belady_hits(trace, cap) for cap in caps] if belady else []
    return Plan(info, block_bytes, caps, ceiling, curves, hits, ram_blocks)


def _size(nbytes: int, most: int | None = None) -> str:
    """``nbytes`` in the largest unit that holds it rounded up (never below the plan), and
    not above ``most`` (a budget) where one is given."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        rounded = -(-nbytes // scale)
        if nbytes >= scale and (most is None or rounded * scale <= most):
            return f"{rounded}{unit}"
    return str(nbytes)


def disk_eviction(rows: list[BelowPoint]) -> str:
    """s3fifo where both policies were replayed below and s3fifo's rows served more."""
    served = dict.fromkeys(BELOW_EVICTIONS, 0)
    for r in rows:
        served[r.below_eviction] += r.from_ram + r.from_below
    compared = {r.below_eviction for r in rows} == set(BELOW_EVICTIONS)
    return "s3fifo" if compared and served["s3fifo"] > served["lru"] else "lru"


#: The hit ratio, in points, that a recommended admission may cost against admit: 1.
ADMISSION_POINTS = 1.0


def disk_admission(rows: list[BelowPoint]) -> tuple[int, float, float, float] | None:
    """Of the admissions replayed in ``rows`` (one RAM size), the one that writes least below
    while it stays within :data:`ADMISSION_POINTS` of ``admit: 1``'s hit ratio over every
    policy of the tier below replayed: ``(admit, admit_sample, share of writes saved, points
    lost)`` (negative: gained); ``None`` where none writes less within them, or where
    ``admit: 1`` was not replayed."""
    every = {r.below_eviction: r for r in rows if r.admit == 1}
    by_rule: dict[tuple[int, float], list[BelowPoint]] = {}
    for r in rows:
        if r.admit > 1 and r.below_eviction in every:
            by_rule.setdefault((r.admit, r.admit_sample), []).append(r)
    fits: list[tuple[int, int, float, float, float]] = []  # written first: the least wins
    for (admit, share), mine in by_rule.items():
        base = [every[r.below_eviction] for r in mine]
        lost = max(100 * (b.prefix_ratio - r.prefix_ratio) for b, r in zip(base, mine))
        written, before = sum(r.written_below for r in mine), sum(b.written_below for b in base)
        if lost <= ADMISSION_POINTS and written < before:
            fits.append((written, admit, share, 1 - written / before, lost))
    if not fits:
        return None
    _, admit, share, saved, lost = min(fits)
    return admit, share, saved, lost


def recommend(plan: Plan) -> str:
    """A chain as YAML: RAM with the best policy, then an LRU fs tier near the ceiling.

    RAM is ``plan.ram_blocks`` (the operator's budget) or else the smallest capacity
    whose best policy keeps half the ceiling's prefix hits; the fs tier is the
    smallest capacity whose LRU keeps 95% of them (the fs tier evicts LRU by default;
    it gets ``eviction: s3fifo`` where :func:`disk_eviction` says so of the --below
    replays, and the admission :func:`disk_admission` finds in them at the RAM chosen).
    The chain's two tiers together are treated as one cache of the larger size; an fs
    tier whose figure is no more than RAM's alone is left out.  RAM's capacity stays
    within the budget where one was given.
    """
    ceiling = plan.ceiling.prefix_hits
    caps, ram_blocks = plan.capacities, plan.ram_blocks

    def best_at(i: int) -> tuple[str, Point]:
        return max(((n, pts[i]) for n, pts in plan.curves.items()),
                   key=lambda item: item[1].prefix_hits)

    ram_i = len(caps) - 1
    for i in range(len(caps)):
        if (ram_blocks is not None and caps[i] >= ram_blocks) or (
            ram_blocks is None and best_at(i)[1].prefix_hits >= RAM_SHARE * ceiling
        ):
            ram_i = i
            break
    policy, ram = best_at(ram_i)
    budget = None if ram_blocks is None else plan.scale(ram_blocks) * plan.block_bytes
    tiers: list[dict[str, Any]] = [{
        "name": "ram", "backend": "host", "eviction": policy,
        "capacity": _size(plan.scale(ram.capacity) * plan.block_bytes, budget),
    }]
    note = f"# ram: {ram.prefix_ratio:.1%} of blocks served from RAM ({policy})"
    lru = plan.curves.get("lru")
    admitted = ""
    disk = next((p for p in lru or [] if p.prefix_hits >= DISK_SHARE * ceiling), None)
    if disk is not None and disk.capacity > ram.capacity and disk.prefix_hits <= ram.prefix_hits:
        note += f"; no disk: LRU's {_size(plan.scale(disk.capacity) * plan.block_bytes)} " \
                f"serves {disk.prefix_ratio:.1%}, no more than RAM"
    elif disk is not None and disk.capacity > ram.capacity:
        evicts = disk_eviction(plan.below)
        tiers.append({"name": "disk", "backend": "fs", "url": "file:///var/cache/kvtier",
                      "capacity": _size(plan.scale(disk.capacity) * plan.block_bytes),
                      **({"eviction": evicts} if evicts != "lru" else {}),
                      "write": "back"})
        note += f"; with disk: {disk.prefix_ratio:.1%}"
        admission = disk_admission([r for r in plan.below if r.ram == ram.capacity])
        if admission is not None:
            admit, share, saved, lost = admission
            tiers[-1]["admit"] = admit
            if share:
                tiers[-1]["admit_sample"] = share
            cost = (f"for {lost:.2f} points" if lost > 0 else f"and {-lost:.2f} points more")
            admitted = (f"# disk admission: {saved:.0%} fewer writes {cost} of hit ratio "
                        "in the --below replays\n")
    note += f"; ceiling {plan.ceiling.prefix_ratio:.1%}\n{admitted}"
    return note + yaml.safe_dump({"chain": tiers}, sort_keys=False)
