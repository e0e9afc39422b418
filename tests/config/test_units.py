"""Sizes and durations as the configuration writes them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (4096, 4096),
        ("4096", 4096),
        ("8GiB", 8 << 30),
        ("8 GiB", 8 << 30),
        ("1.5KiB", 1536),
        ("500MB", 500_000_000),
        ("2m", 2_000_000),
        ("1TiB", 1 << 40),
        ("3b", 3),
        ("7kib", 7168),
        ("2PiB", 2 << 50),
        ("1EiB", 1 << 60),
        ("3PB", 3 * 1000**5),
    ],
)
def test_parse_size(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", [-1, "-1GiB", "8 gigs", "GiB", "", True, 1.5, None, "1e3", "1ZiB"])
def test_parse_size_rejects(bad: object) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (2, 2.0),
        (0.5, 0.5),
        ("250ms", 0.25),
        ("2s", 2.0),
        ("1m", 60.0),
        ("1.5h", 5400.0),
        ("3", 3.0),
        ("7d", 604800.0),
    ],
)
def test_parse_duration(text: object, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", [-1, "soon", "1w", "7 days", False, None])
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_format_size() -> None:
    assert [format_size(n) for n in (0, 1023, 1024, 3 << 20, 5 << 40)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "3.0 MiB",
        "5.0 TiB",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.72, "720ms"), (3.5, "3.5s"), (3.4999, "3.5s"), (0.0005, "0.5ms"), (0.0, "0ms"),
     (1e-9, "0.000001ms"), (12345.0, "12300s"), (0.9999, "1000ms"), (2048.0, "2050s")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0])
def test_format_duration_rejects(bad: float) -> None:
    with pytest.raises(ValueError):
        format_duration(bad)


@settings(max_examples=500, deadline=None)
@given(st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
       st.integers(1, 17))
def test_format_duration_reads_back_for_any_time(seconds: float, digits: int) -> None:
    """Every finite time, denormals to the largest float, parses back within its digits."""
    text = format_duration(seconds, digits)
    assert "e" not in text.removesuffix("s").removesuffix("m")  # never an exponent
    # half a unit of the last digit; a whole one where rounding up passes the largest float
    units = 0.51 if seconds < 1e307 else 1.0
    # (and a float's own rounding: parsing multiplies milliseconds by 0.001)
    rel = max(units * 10 ** (1 - digits), 1e-15)
    assert parse_duration(text) == pytest.approx(seconds, rel=rel, abs=1e-300)
