"""kvtier's block-store contract: hooks, value types and errors.

Everything a backend author needs is importable from here::

    from kvtier.spec import hookimpl, Capabilities, Option, BackendError
"""

from __future__ import annotations

from . import hookspecs
from .errors import (
    BackendError,
    ClosedError,
    ConfigError,
    ConnectionClosedError,
    ContractError,
    CorruptBlockError,
    KvtierError,
    PluginError,
    ProtocolError,
    RefusedError,
    VersionMismatchError,
)
from .hookspecs import (
    CONTRACT_VERSION,
    MAX_KEY_SIZE,
    REQUIRED_HOOKS,
    BytesLike,
    hookimpl,
    hookspec,
)
from .types import Capabilities, Option, OptionType, ScanEntry

__all__ = [
    "CONTRACT_VERSION",
    "MAX_KEY_SIZE",
    "REQUIRED_HOOKS",
    "BackendError",
    "BytesLike",
    "Capabilities",
    "ClosedError",
    "ConfigError",
    "ConnectionClosedError",
    "ContractError",
    "CorruptBlockError",
    "KvtierError",
    "Option",
    "OptionType",
    "PluginError",
    "ProtocolError",
    "RefusedError",
    "ScanEntry",
    "VersionMismatchError",
    "hookimpl",
    "hookspec",
    "hookspecs",
]
