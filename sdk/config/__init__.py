"""Chain configuration: the YAML loader and the size and duration units.

May import :mod:`kvtier.block` (codec names, shuffle widths and zstd levels
are facts of the block format), :mod:`kvtier.plugins` (to validate backend
options) and :mod:`kvtier.spec`.
"""

from __future__ import annotations

from kvtier.config.loader import (
    TIER_KEYS,
    ChainConfig,
    MetricsConfig,
    TierConfig,
    describe,
    load_config,
)
from kvtier.config.units import format_size, parse_duration, parse_size

__all__ = [
    "TIER_KEYS",
    "ChainConfig",
    "MetricsConfig",
    "TierConfig",
    "describe",
    "format_size",
    "load_config",
    "parse_duration",
    "parse_size",
]
