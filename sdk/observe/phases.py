"""Timestamps of where a load's time goes, for benchmarks: off unless ``KVTIER_PHASES`` is set.

``bench/vllm_ttft.py`` sets ``KVTIER_PHASES=1`` in its engine processes and
reads the spans back after each prompt to split a hit's time to first token
into phases (the chain's jobs, the backend's reads, the checksum pass, the
engine's copy to its device).  Off, a recording site costs one test of
:data:`ENABLED`; on, one ``perf_counter`` call and one ``list.append``
(atomic under the GIL, so any thread may record).
"""

from __future__ import annotations

import os
from typing import NamedTuple

__all__ = ["ENABLED", "Span", "span", "take"]

#: Read once, when kvtier is imported: a process records for all its life or not at all.
ENABLED = os.environ.get("KVTIER_PHASES", "") not in ("", "0")


class Span(NamedTuple):
    """One timed piece of work: ``what`` from ``start`` to ``end`` (``time.perf_counter``)."""

    what: str
    start: float
    end: float
    #: blocks (or keys) it covered
    blocks: int = 0


_spans: list[Span] = []


def span(what: str, start: float, end: float, blocks: int = 0) -> None:
    """Record one span (a no-op unless :data:`ENABLED`)."""
    if ENABLED:
        _spans.append(Span(what, start, end, blocks))


def take() -> list[Span]:
    """The spans recorded since the last call, oldest first; the record is emptied."""
    global _spans
    taken, _spans = _spans, []
    return taken
