"""Backend discovery: entry points, validation against the hook spec, handles, options.

May import :mod:`kvtier.spec` only.
"""

from __future__ import annotations

from kvtier.plugins.registry import (
    ENTRY_POINT_GROUP,
    INSTALL_HINTS,
    BackendHandle,
    BackendInfo,
    BackendRegistry,
    default_registry,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "INSTALL_HINTS",
    "BackendHandle",
    "BackendInfo",
    "BackendRegistry",
    "default_registry",
]
