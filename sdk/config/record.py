"""The chain's ``record`` key: a trace of its traffic for ``kvtier plan``.

One top-level key of the chain's YAML, a path or a mapping::

    record: /var/log/kvtier/trace.jsonl
    record:
      path: ${HOME}/kvtier-trace.jsonl
      sample: 0.05          # keep this share of calls (0 < sample <= 1; default 1)

The trace holds key hashes only, never payloads (:mod:`kvtier.chain.record`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtier.config.load_policy import Fail, Scalar
from kvtier.plugins.options import describe_value

__all__ = ["RECORD_KEYS", "RecordConfig", "parse_record"]

#: The top-level keys this module reads.
RECORD_KEYS = ("record",)
_ENTRY_KEYS = ("path", "sample")


@dataclass(frozen=True)
class RecordConfig:
    path: str
    sample: float = 1.0


def parse_record(top: Mapping[str, Any], scalar: Scalar, fail: Fail) -> RecordConfig | None:
    """The ``record`` key of the top-level mapping, parsed with the validator's helpers."""
    raw = top.get("record")
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = {"path": raw}
    if not isinstance(raw, Mapping):
        fail("record", f"expected a path or a mapping with path and sample, "
                       f"got {describe_value(raw)}")
    for key in raw:
        if key not in _ENTRY_KEYS:
            fail(f"record.{key}", f"unknown key {key!r}; record takes {', '.join(_ENTRY_KEYS)}")
    path = scalar(raw.get("path"), "record.path", "str")
    if not path:
        fail("record.path", "missing: the file the trace is appended to")
    sample = scalar(raw.get("sample"), "record.sample", "float")
    if sample is not None and not 0 < sample <= 1:
        fail("record.sample", f"expected a share above 0 and at most 1, got {sample}")
    return RecordConfig(str(path), 1.0 if sample is None else float(sample))
