"""Human-friendly sizes and durations: ``8GiB``, ``500MB``, ``250ms``, ``2m``.

Parsing is the ``size`` and ``duration`` option types, so it lives with the
option parsing in :mod:`kvtier.plugins.options`; this module is its public name.
"""

from __future__ import annotations

import math
from decimal import ROUND_DOWN, ROUND_HALF_EVEN, Context, Decimal

from kvtier.plugins.options import finite, parse_duration, parse_size

__all__ = ["format_duration", "format_size", "parse_duration", "parse_size"]


def format_size(n: float) -> str:
    """``2097152`` -> ``2.0 MiB``; for tables and messages."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float, digits: int = 3) -> str:
    """``0.72`` -> ``720ms``, ``3.5`` -> ``3.5s``: ``digits`` significant digits, in a form
    :func:`parse_duration` reads back, whatever the time.

    Never an exponent (``f"{3500:.3g}"`` is ``3.5e+03``, which no duration
    parser takes); milliseconds below a second, seconds from there.  Raises
    ``ValueError`` for a negative, NaN or infinite time.
    """
    value = finite(seconds)
    if value < 0:
        raise ValueError(f"a duration cannot be negative, got {seconds}")
    amount, unit = (value * 1e3, "ms") if value < 1 else (value, "s")
    exact = Decimal(repr(amount))
    rounded = Context(prec=digits, rounding=ROUND_HALF_EVEN).plus(exact)
    if not math.isfinite(float(rounded)):  # rounded up past the largest float
        rounded = Context(prec=digits, rounding=ROUND_DOWN).plus(exact)
    text = format(rounded, "f")  # "f" writes no exponent
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text}{unit}"
