"""Chain configuration: the YAML loader, the size and duration units, and ``explain``
(every effective setting and where it came from).

May import :mod:`kvtier.block` (codec names, shuffle widths and zstd levels
are facts of the block format), :mod:`kvtier.plugins` (to validate backend
options) and :mod:`kvtier.spec`.
"""

from __future__ import annotations

from kvtier.config.chain_config import (
    TIER_KEYS,
    ChainConfig,
    MetricsConfig,
    TierConfig,
    load_config,
)
from kvtier.config.explain import Setting, explain
from kvtier.config.units import format_size, parse_duration, parse_size

# the one parser of declared options, for the integrations that declare theirs (vLLM's tier)
from kvtier.plugins.options import parse_option

__all__ = [
    "TIER_KEYS",
    "ChainConfig",
    "MetricsConfig",
    "Setting",
    "TierConfig",
    "explain",
    "format_size",
    "load_config",
    "parse_duration",
    "parse_option",
    "parse_size",
]
