"""Human-friendly sizes and durations: ``8GiB``, ``500MB``, ``250ms``, ``2m``."""

from __future__ import annotations

import re

__all__ = ["format_size", "parse_duration", "parse_size"]

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|)\s*$")


def parse_size(value: object) -> int:
    """Bytes from an ``int`` or a string like ``8GiB``, ``1.5 GB``, ``4096``.

    Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (KB,
    MB, GB, TB, and single letters) powers of 1000.  Raises ``ValueError``
    with the accepted forms for anything else, including negative sizes.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 8GiB or 4096, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match:
            unit = match.group(2).lower()
            if unit in _SIZE_UNITS:
                return int(float(match.group(1)) * _SIZE_UNITS[unit])
    raise ValueError(f"expected a size such as 8GiB, 500MB or 4096 (bytes), got {value!r}")


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like ``250ms``, ``2s``, ``1m``, ``1h``, ``7d``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 250ms or 2s, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value}")
        return float(value)
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match:
            return float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    raise ValueError(f"expected a duration such as 250ms, 2s or 1m, got {value!r}")


def format_size(n: float) -> str:
    """``2097152`` -> ``2.0 MiB``; for tables and messages."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
