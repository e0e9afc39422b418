"""The one error hierarchy of kvtier.

A miss is never an error: hooks answer ``None`` or ``False`` for it.  These
errors are for faults.  Each also inherits the built-in exception a caller
would naturally catch, so ``except OSError`` or ``except ValueError`` works too.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "ClosedError",
    "ConfigError",
    "ContractError",
    "KvtierError",
    "PluginError",
]


class KvtierError(Exception):
    """Base of every error kvtier raises on purpose."""


class BackendError(KvtierError, OSError):
    """A backend's storage failed: I/O error, server unreachable, disk full.

    Backends raise this (or any ``OSError``) for faults; the chain marks the
    tier unhealthy and serves the operation as misses.
    """


class ClosedError(KvtierError, RuntimeError):
    """A backend, tier or chain was used after ``close()``."""


class ConfigError(KvtierError, ValueError):
    """A configuration is invalid.

    ``where`` names the place (``file:line``) and ``key`` the offending key
    path when they are known, so the message can point at them.
    """

    def __init__(self, message: str, *, where: str | None = None, key: str | None = None):
        self.where = where
        self.key = key
        self.reason = message
        parts = [p for p in (where, key) if p]
        super().__init__(": ".join([*parts, message]))


class PluginError(KvtierError, ImportError):
    """A backend plugin could not be loaded or does not match the contract."""


class ContractError(KvtierError, TypeError):
    """A backend answered in a way the contract forbids (wrong length, wrong type)."""
