"""``kvtier plan``: what each byte of cache buys, from a trace of real or generated traffic.

It replays a trace through the eviction code of kvtier's tiers (the policy
objects of :mod:`kvtier.policies`, on a null data path) at many capacities and
reports miss-ratio curves, the infinite-cache ceiling, Belady's bound,
prefill tokens saved, blocks written below RAM, and a chain to paste; and a
fleet of engines sharing a pool (:mod:`.fleet`).  Traces come from Mooncake
JSONL, a chain's recording, or vLLM's KV-cache events (:mod:`.vllm_events`, which
also records them).

May import :mod:`kvtier.policies` (the policies it replays, and the chain's
admission sketch), :mod:`kvtier.config` (the check of admit against
admit_sample), :mod:`kvtier.console` (where its commands print) and
:mod:`kvtier.plugins` (size parsing); nothing in the data path imports it.
"""

from __future__ import annotations

from .curves import BLOCK_SCALE, INFINITE, Point, belady_hits, infinite_point, lru_curve, replay
from .report import Plan, default_capacities, make_plan, recommend
from .trace import BLOCK_TOKENS, Request, Trace, generate, read_trace, write_mooncake

__all__ = [
    "BLOCK_SCALE", "BLOCK_TOKENS", "INFINITE", "Plan", "Point", "Request", "Trace", "belady_hits",
    "default_capacities", "generate", "infinite_point", "lru_curve", "make_plan", "read_trace",
    "recommend", "replay", "write_mooncake",
]
