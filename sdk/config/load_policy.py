"""The chain's load policy: whether a hit is worth loading, and what recomputing costs.

Four top-level keys of the chain's YAML::

    load_policy: cost        # cost (default) or always
    recompute: 0.5ms/token   # or by prompt length: {512 tokens: 40ms, 2048 tokens: 180ms}
    load_margin: 0.8         # load a prefix where loading takes at most 0.8x recomputing it
    cost_half_life: 2s       # how fast a tier's measured cost forgets the past

With ``load_policy: cost`` and a ``recompute`` model, the chain answers an
engine's "how much of this prefix do you hold" with the longest prefix whose
predicted load time beats recomputing it (:mod:`kvtier.chain.cost`).  Without
a ``recompute`` model there is nothing to weigh a load against: the chain
loads every hit, as with ``always``, and its stats say so.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from kvtier.config.units import format_duration
from kvtier.plugins.options import describe_value, parse_duration

__all__ = ["LOAD_POLICIES", "LoadConfig", "Recompute", "parse_recompute"]

LOAD_POLICIES = ("cost", "always")
_PER_TOKEN_RE = re.compile(r"^\s*(.+?)\s*/\s*tokens?\s*$")
_TOKENS_RE = re.compile(r"\s*tokens?\s*$")


@dataclass(frozen=True)
class Recompute:
    """The time to prefill ``t`` tokens: linear through the origin and ``points``.

    ``points`` are ``(tokens, seconds)`` pairs, tokens increasing; beyond the
    last the last segment's slope goes on.  ``0.5ms/token`` is the one point
    ``(1, 0.0005)``.
    """

    points: tuple[tuple[int, float], ...]

    def seconds(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        lo_t, lo_s = 0, 0.0
        for hi_t, hi_s in self.points:
            if tokens <= hi_t:
                return lo_s + (hi_s - lo_s) * (tokens - lo_t) / (hi_t - lo_t)
            lo_t, lo_s = hi_t, hi_s
        prev_t, prev_s = self.points[-2] if len(self.points) > 1 else (0, 0.0)
        slope = (lo_s - prev_s) / (lo_t - prev_t)
        return lo_s + slope * (tokens - lo_t)

    def describe(self) -> str:
        # as the YAML writes them (no exponent), to six significant digits
        if len(self.points) == 1 and self.points[0][0] == 1:
            return f"{format_duration(self.points[0][1], 6)}/token"
        return ", ".join(f"{t} tokens: {format_duration(s, 6)}" for t, s in self.points)


@dataclass(frozen=True)
class LoadConfig:
    policy: str = "cost"
    recompute: Recompute | None = None
    margin: float = 0.8
    half_life: float = 2.0

    @property
    def weighs(self) -> bool:
        """Whether loads are weighed against recomputing (else every hit is loaded)."""
        return self.policy == "cost" and self.recompute is not None

    def describe(self) -> str:
        """The policy in effect, as ``stats()`` and ``kvtier inspect`` show it."""
        if self.policy == "always":
            return "always"
        if self.recompute is None:
            return "always (no recompute model configured)"
        return f"cost (recompute {self.recompute.describe()}, margin {self.margin:g})"


def parse_recompute(value: Any, fail: Callable[[str], NoReturn]) -> Recompute:
    """``0.5ms/token`` (a duration per token) or a mapping of prompt length to duration."""
    if isinstance(value, str):
        match = _PER_TOKEN_RE.match(value)
        if match is None:
            fail(f"expected a duration per token such as 0.5ms/token, or a mapping of "
                 f"prompt length to duration, got {describe_value(value)}")
        try:
            per_token = parse_duration(match.group(1))
        except ValueError as exc:
            fail(str(exc))
        if per_token <= 0:
            fail("must be longer than 0ms/token")
        return Recompute(((1, per_token),))
    if not isinstance(value, Mapping) or not value:
        fail(f"expected a duration per token such as 0.5ms/token, or a mapping of prompt "
             f"length to duration, got {describe_value(value)}")
    points: list[tuple[int, float]] = []
    for tokens, duration in value.items():
        try:
            t = int(_TOKENS_RE.sub("", tokens) if isinstance(tokens, str) else tokens)
            s = parse_duration(duration)
        except ValueError as exc:
            fail(f"{tokens!r}: {exc}")
        if t <= 0 or s <= 0:
            fail(f"{tokens!r}: prompt lengths and durations must be above 0")
        points.append((t, s))
    points.sort()
    for (t0, s0), (t1, s1) in itertools.pairwise(points):
        if t0 == t1 or s1 < s0:
            fail(f"{t1} tokens: durations must grow with prompt length")
    return Recompute(tuple(points))
