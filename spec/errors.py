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
    "ConnectionClosedError",
    "ContractError",
    "CorruptBlockError",
    "KvtierError",
    "PluginError",
    "ProtocolError",
    "RefusedError",
    "VersionMismatchError",
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


class CorruptBlockError(KvtierError, ValueError):
    """A stored block failed a check: wrong magic, namespace, key, length or checksum.

    Never reaches a chain's caller: the tier counts it and answers a miss.
    """


# -- the peer protocol (``kvtier serve`` and the ``peer`` backend) -------------


class ProtocolError(KvtierError, ValueError):
    """A frame or message broke the peer protocol: bad magic, limits, types or lengths."""


class VersionMismatchError(ProtocolError):
    """The other side speaks another protocol ``version``."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


class RefusedError(KvtierError):
    """A peer refused the handshake: protocol version, authentication, namespace.

    A configuration problem, not an outage: ``auth`` tells whether the
    secret was the reason.
    """

    def __init__(self, message: str, auth: bool = False) -> None:
        super().__init__(message)
        self.auth = auth


class ConnectionClosedError(KvtierError, ConnectionError):
    """The other side closed the connection; ``received`` bytes of the read had arrived."""

    def __init__(self, message: str, received: int = 0) -> None:
        super().__init__(message)
        self.received = received
