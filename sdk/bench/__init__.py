"""``kvtier bench``: every tier beside the raw ceiling of its medium, in one run.

Builds on :mod:`kvtier.chain`; nothing in the data path imports it.
"""

from __future__ import annotations

from kvtier.bench.runner import BUILTIN, BenchSettings, Progress, machine, run_tiers

__all__ = ["BUILTIN", "BenchSettings", "Progress", "machine", "run_tiers"]
