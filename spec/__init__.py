"""kvtier's block-store contract: hooks, value types and errors.

Everything a backend author needs is importable from here::

    from kvtier.spec import hookimpl, Capabilities, Option, BackendError

and the base class that implements the contract's shared rules once, with
the helpers for a batch::

    from kvtier.spec import BlockStore, check_batch, run_batch

May import nothing of kvtier: a backend that imports only the spec depends
on nothing else of it.
"""

from __future__ import annotations

from . import deprecated, hookspecs
from .base import BlockStore, Deadlines, Evicted, Expire, GetInto, Keep, PutParts, Scan, Tamper
from .batch import Failed, check_batch, earliest_deadlines, first_positions, map_batch, run_batch
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
from .types import Capabilities, CapacityScope, Option, OptionType, Renamed, ScanEntry

__all__ = [
    "CONTRACT_VERSION",
    "MAX_KEY_SIZE",
    "REQUIRED_HOOKS",
    "BackendError",
    "BlockStore",
    "BytesLike",
    "Capabilities",
    "CapacityScope",
    "ClosedError",
    "ConfigError",
    "ConnectionClosedError",
    "ContractError",
    "CorruptBlockError",
    "Deadlines",
    "Evicted",
    "Expire",
    "Failed",
    "GetInto",
    "Keep",
    "KvtierError",
    "Option",
    "OptionType",
    "PluginError",
    "ProtocolError",
    "PutParts",
    "RefusedError",
    "Renamed",
    "Scan",
    "ScanEntry",
    "Tamper",  # deprecated, for one release: see kvtier.spec.deprecated
    "VersionMismatchError",
    "check_batch",
    "deprecated",
    "earliest_deadlines",
    "first_positions",
    "hookimpl",
    "hookspec",
    "hookspecs",
    "map_batch",
    "run_batch",
]
