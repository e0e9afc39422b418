"""``kvtier bench``: every tier beside the raw ceiling of its medium, in one run.

It ships with kvtier and measures the machine and tiers it runs on.  The
repository's benchmark scripts (``bench/``, not installed: they write the
figures and charts of BENCHMARKS.md) are apart from it; some import it.

Builds on :mod:`kvtier.chain`; nothing in the data path imports it.

May import :mod:`kvtier` (the chain it measures), :mod:`kvtier.block`,
:mod:`kvtier.chain`, :mod:`kvtier.config`, :mod:`kvtier.console`,
:mod:`kvtier.peer.protocol` (a peer's raw ceiling) and :mod:`kvtier.plugins`.
"""

from __future__ import annotations

from kvtier.tierbench.runner import BUILTIN, BenchSettings, Progress, machine, run_tiers

__all__ = ["BUILTIN", "BenchSettings", "Progress", "machine", "run_tiers"]
