"""The chain's ``record`` key: a trace of its traffic for ``kvtier plan``.

One top-level key of the chain's YAML, a path or a mapping::

    record: /var/log/kvtier/trace.jsonl
    record:
      path: ${HOME}/kvtier-trace.jsonl
      sample: 0.05          # keep this share of calls (0 < sample <= 1; default 1)

The trace holds key hashes only, never payloads (:mod:`kvtier.chain.record`).
Its keys are declared with the chain's others
(:data:`~kvtier.config.settings.CHAIN_OPTIONS`: ``record.path``, ``record.sample``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RecordConfig"]


@dataclass(frozen=True)
class RecordConfig:
    path: str
    sample: float = 1.0
