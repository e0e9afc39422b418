"""Sizes and durations as the configuration writes them."""

from __future__ import annotations

import pytest

from kvtier.config.units import format_size, parse_duration, parse_size


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
    ],
)
def test_parse_size(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", [-1, "-1GiB", "8 gigs", "GiB", "", True, 1.5, None, "1e3"])
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
