"""The ``redis`` backend's options: declared, then parsed and checked once more at open.

kvtier checks a tier's options against :data:`OPTIONS` before it opens the
backend; :meth:`Settings.parse` checks them again, as a backend installed
beside any kvtier must (a caller may open it directly, with raw values:
``"64MiB"``, ``"true"``), and adds the checks that span options (a password
in the url and as an option, ``shards`` without ``cluster``).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtier.config.units import parse_duration, parse_size
from kvtier.policies.tenancy import (
    EXPIRE_OPTION,
    TENANT_OPTION,
    TENANTS_OPTION,
    Expiry,
    TenantRules,
)
from kvtier.spec import ConfigError, Option
from kvtier.spec.shared import CAPACITY, CONCURRENCY, CONNECT_TIMEOUT, TIMEOUT, but

__all__ = ["OPTIONS", "REDIS_MAX_STRING", "Settings", "redact"]

#: Largest string value Redis stores (its ``proto-max-bulk-len`` default).
REDIS_MAX_STRING = 512 * 1024 * 1024
_SCHEMES = ("redis", "rediss", "unix")


def _check_url(value: Any) -> None:
    scheme = urllib.parse.urlsplit(str(value)).scheme
    if scheme not in _SCHEMES:
        raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got scheme {scheme!r}")


def _check_prefix(value: Any) -> None:
    if not str(value):
        raise ValueError("must not be empty: it keeps kvtier's keys apart from others'")


def _at_least(least: int) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value < least:
            raise ValueError(f"must be at least {least}, got {value}")

    return check


def _check_max_block_size(value: Any) -> None:
    if not 0 < int(value) <= REDIS_MAX_STRING:
        raise ValueError(f"must be between 1 byte and 512MiB (Redis' largest string), got {value}")


OPTIONS: Mapping[str, Option] = {
    "url": Option(
        "str",
        "Redis server: redis://host:port/db, rediss://host:port/db (TLS) or "
        "unix:///path/redis.sock?db=N. Put the password in `password`, not here.",
        default="redis://127.0.0.1:6379/0",
        check=_check_url,
    ),
    "prefix": Option(
        "str",
        "First part of every Redis key this tier writes: <prefix>:<namespace>:...",
        default="kvtier",
        check=_check_prefix,
    ),
    "capacity": but(CAPACITY, check=_at_least(1)),
    "max_block_size": Option(
        "size", "Refuse larger blocks (Redis strings hold at most 512MiB).", default="512MiB",
        check=_check_max_block_size,
    ),
    "username": Option("str", "ACL user name (Redis 6 and later).", default=None),
    "password": Option(
        "str", "Password for AUTH; use ${REDIS_PASSWORD} in YAML.", default=None, secret=True
    ),
    "connect_timeout": but(CONNECT_TIMEOUT, default="5s"),
    "timeout": but(TIMEOUT, default="30s"),
    "retries": Option(
        "int", "Resend a batch after a connection error or timeout this many times.", default=1,
        check=_at_least(0),
    ),
    "max_connections": but(CONCURRENCY, default=16),
    "batch_bytes": Option(
        "size", "Block bytes per put script; larger puts are split, still one round trip.",
        default="64MiB",
        check=_at_least(1),
    ),
    "cluster": Option(
        "bool", "The url names a node of a Redis (or Valkey) Cluster; the namespace is "
        "split into hash-tagged shards spread over the masters.", default=False,
    ),
    "shards": Option(
        "int", "Shards of a new namespace (cluster only; the capacity is split evenly "
        "between them). Unset: 16 for a new namespace, the stored count for an existing one.",
        default=None,
        check=_at_least(1),
    ),
    # kvtier's own declarations, parsed by their parse functions (_read_parsed)
    "tenants": TENANTS_OPTION,
    "tenant": TENANT_OPTION,
    "expire": EXPIRE_OPTION,
}


def redact(url: str) -> str:
    """``url`` without its user name and password, for messages."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, ""))


def _read(options: Mapping[str, Any], name: str) -> Any:
    """Option ``name`` parsed to its type and checked, the default if unset; None if neither."""
    option = OPTIONS[name]
    value = options.get(name)
    if value is None:
        value = option.default
    if value is None:
        return None
    try:
        if option.type == "size":
            value = parse_size(value)
        elif option.type == "duration":
            value = parse_duration(value)
        elif option.type == "int" and not isinstance(value, int):
            value = int(value)
        if option.check is not None:
            option.check(value)
    except (TypeError, ValueError) as exc:
        reason = "rejected (value hidden: secret option)" if option.secret else str(exc)
        raise ConfigError(reason, key=name) from None
    return value


def _read_parsed(options: Mapping[str, Any], name: str) -> Any:
    """Option ``name`` through its declared ``parse`` (kvtier's parsed value passes as it is)."""
    option = OPTIONS[name]
    value = options.get(name)
    if value is None:
        value = option.default
    if option.parse is None:
        return value
    try:
        return option.parse(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc), key=name) from None


def _read_text(options: Mapping[str, Any], name: str) -> str | None:
    value = _read(options, name)
    return None if value is None else str(value)


def _read_count(options: Mapping[str, Any], name: str, *, least: int) -> int:
    value = _read(options, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"must be an integer of at least {least}, got {value!r}", key=name)
    return value


def _read_flag(options: Mapping[str, Any], name: str) -> bool:
    value = _read(options, name)
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    if not isinstance(value, bool):
        raise ConfigError(f"must be true or false, got {value!r}", key=name)
    return value


@dataclass(frozen=True)
class Settings:
    url: str
    prefix: str
    capacity: int | None
    max_block_size: int
    username: str | None
    password: str | None
    connect_timeout: float
    timeout: float
    retries: int
    max_connections: int
    batch_bytes: int
    cluster: bool = False
    shards: int | None = None
    #: The tenants' rules: set, the capacity is the pool's (every namespace
    #: under the prefix), shared by the tenants as the rules say.
    tenants: TenantRules = field(default_factory=TenantRules)
    #: Whose blocks this instance holds (the chain passes its namespace's).
    tenant: str = "default"
    expire: Expiry = field(default_factory=Expiry)

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> Settings:
        """Validate ``options`` (parsed by kvtier already, or raw when called directly)."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigError(
                f"is not an option of the redis backend ({', '.join(OPTIONS)})", key=unknown[0]
            )
        settings = cls(
            url=str(_read(options, "url")),
            prefix=str(_read(options, "prefix")),
            capacity=(
                None if _read(options, "capacity") is None
                else _read_count(options, "capacity", least=1)
            ),
            max_block_size=_read_count(options, "max_block_size", least=1),
            username=_read_text(options, "username"),
            password=_read_text(options, "password"),
            connect_timeout=float(_read(options, "connect_timeout")),
            timeout=float(_read(options, "timeout")),
            retries=_read_count(options, "retries", least=0),
            max_connections=_read_count(options, "max_connections", least=1),
            batch_bytes=_read_count(options, "batch_bytes", least=1),
            cluster=_read_flag(options, "cluster"),
            shards=(
                None if _read(options, "shards") is None
                else _read_count(options, "shards", least=1)
            ),
            tenants=_read_parsed(options, "tenants"),
            tenant=str(_read_parsed(options, "tenant")),
            expire=_read_parsed(options, "expire"),
        )
        if settings.shards is not None and not settings.cluster:
            raise ConfigError("applies to a cluster only (cluster: true)", key="shards")
        url = urllib.parse.urlsplit(settings.url)
        if url.password is not None and settings.password is not None:
            raise ConfigError("a password is given in the url and as an option", key="password")
        if url.username and settings.username is not None:
            raise ConfigError("a user is given in the url and as an option", key="username")
        return settings

    @property
    def pooled(self) -> bool:
        """Counted in the pool of every namespace under the prefix, per tenant."""
        return bool(self.tenants)

    @property
    def limit(self) -> int:
        """Largest block stored: a block over the capacity could never fit."""
        if self.capacity is None:
            return self.max_block_size
        return min(self.capacity, self.max_block_size)
