"""Every effective setting of a loaded chain, and where it came from: ``kvtier config explain``.

A setting comes from the ``file`` (its ``file:line``), from the ``env``
(a ``${VAR}`` in the file, found in the environment: the variable is named,
the line is the file's) or is the ``default``.  Each tier gives a row for
every key every tier takes (:data:`~kvtier.config.settings.TIER_OPTIONS`) and for
every option its backend declares, set or not, under the key a file writes
(a value given under an old key is the new key's, from the file); the chain
gives a row for each of its own keys (:data:`~kvtier.config.settings.CHAIN_OPTIONS`).
Values of secret options are ``***`` whatever their source, unless empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvtier.config.chain_config import ChainConfig, TierConfig
from kvtier.config.settings import CHAIN_OPTIONS, TIER_OPTIONS
from kvtier.config.units import format_duration
from kvtier.plugins.options import old_keys, user_key
from kvtier.plugins.registry import BackendRegistry, default_registry

__all__ = ["CHAIN", "SOURCES", "Setting", "explain"]

#: Where a setting can come from.
SOURCES = ("default", "file", "env")
#: The ``tier`` of the chain's own settings.
CHAIN = "(chain)"
#: Tier keys that have no meaning on the first tier: shown as ``-`` there.
_BELOW_ONLY = frozenset({"write", "admit", "admit_sample"})
_SIZE_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024),
               ("TB", 1000**4), ("GB", 1000**3), ("MB", 1000**2), ("KB", 1000))


@dataclass(frozen=True)
class Setting:
    """One effective setting: ``value`` is display text (``***`` for a secret)."""

    tier: str
    key: str
    value: str
    source: str
    #: ``file:line`` of the key, for ``file`` and ``env``; ``None`` for a default.
    where: str | None = None
    #: The environment variables the value was read from (``env`` only).
    variables: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {"tier": self.tier, "key": self.key, "value": self.value, "source": self.source,
                "where": self.where, "variables": list(self.variables)}


def explain(config: ChainConfig, registry: BackendRegistry | None = None) -> list[Setting]:
    """The rows of ``kvtier config explain``: each tier's, top to bottom, then the chain's.

    ``registry`` must be the one ``config`` was loaded with (for the options'
    types); a backend's declared options are listed in its declaration order.
    """
    reg = registry if registry is not None else default_registry()
    rows = [row for i, tier in enumerate(config.tiers) for row in _tier_rows(config, tier, i, reg)]
    return rows + list(_chain_rows(config))


def show_size(n: int) -> str:
    """Bytes as the file would write them: ``8GiB``, ``500MB``, ``4097``."""
    for unit, factor in _SIZE_UNITS:
        if n and n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)


def show(value: Any, kind: str = "") -> str:
    if value is None:
        return "-"
    if kind in ("size", "size_or_percent") and type(value) is int:
        return show_size(value)
    if kind == "duration":
        return format_duration(value, 6)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return str(value)


def _origin(config: ChainConfig, tier: str, key: str, value: str,
            *paths: str) -> Setting:
    """``key``'s row: from the first of ``paths`` the source sets, else the default."""
    for path in paths:
        if path in config.given:
            names = sorted({n for p, found in config.env.items()
                            if p == path or p.startswith((f"{path}.", f"{path}["))
                            for n in found})
            return Setting(tier, key, value, "env" if names else "file", config.given[path],
                           tuple(names))
    return Setting(tier, key, value, "default")


def _tier_rows(config: ChainConfig, tier: TierConfig, index: int,
               registry: BackendRegistry) -> Iterator[Setting]:
    for key, opt in TIER_OPTIONS.items():
        if key == "codec":  # one key: its parts as the file writes them
            value: Any = _codec(tier)
        else:
            value = getattr(tier, key)
        text = "-" if index == 0 and key in _BELOW_ONLY else show(value, opt.type)
        yield _origin(config, tier.name, key, text,
                      *(f"{tier.path}.{k}" for k in _written(key, opt)))
    for name, opt in registry.options(tier.backend).items():
        if opt.internal and f"{tier.path}.{user_key(name, opt)}" not in config.given:
            continue  # set by kvtier's commands, or derived: no setting of a file
        value = tier.options.get(name)
        # an empty value holds no secret, and saying it is empty helps
        masked = name in tier.secret_options and value not in (None, "", {}, [])
        text = "***" if masked else show(value, opt.type)
        yield _origin(config, tier.name, user_key(name, opt), text,
                      *(f"{tier.path}.{k}" for k in _written(name, opt)))


def _written(name: str, opt: Any) -> tuple[str, ...]:
    """The keys a file may have given the option under: its key, then its old ones."""
    return (user_key(name, opt), *(r.name for r in old_keys(name, opt)))


def _codec(tier: TierConfig) -> str:
    text = tier.codec + (f":{tier.codec_level}" if tier.codec_level != 1 else "")
    return text + (f":shuffle={tier.shuffle}" if tier.shuffle != "auto" else "")


def _chain_rows(config: ChainConfig) -> Iterator[Setting]:
    load, record, metrics = config.load, config.record, config.metrics
    values: dict[str, Any] = {
        "load_policy": load.policy,
        "recompute": load.recompute.describe() if load.recompute is not None else None,
        "load_margin": load.margin,
        "cost_half_life": load.half_life,
        "record.path": record.path if record else None,
        "record.sample": record.sample if record else None,
        "metrics.prometheus_port": metrics.prometheus_port,
        "metrics.prometheus_host": metrics.prometheus_host,
        "metrics.log_interval": metrics.log_interval,
        "metrics.tenants_top": metrics.tenants_top,
        "metrics.tenants_interval": metrics.tenants_interval,
    }
    for key, opt in CHAIN_OPTIONS.items():
        # ``record: FILE`` is short for ``record: {path: FILE}``
        also = ("record",) if key == "record.path" else ()
        kind = opt.type if opt.parse is None else ""
        yield _origin(config, CHAIN, key, show(values[key], kind), key, *also)
