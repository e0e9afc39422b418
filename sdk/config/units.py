"""Human-friendly sizes and durations: ``8GiB``, ``500MB``, ``250ms``, ``2m``.

Parsing is the ``size`` and ``duration`` option types, so it lives with the
option parsing in :mod:`kvtier.plugins.options`; this module is its public name.
"""

from __future__ import annotations

from kvtier.plugins.options import parse_duration, parse_size

__all__ = ["format_size", "parse_duration", "parse_size"]


def format_size(n: float) -> str:
    """``2097152`` -> ``2.0 MiB``; for tables and messages."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
