"""Every effective setting of a loaded chain, and where it came from: ``kvtier config explain``.

A setting comes from the ``file`` (its ``file:line``), from the ``env``
(a ``${VAR}`` in the file, found in the environment: the variable is named,
the line is the file's) or is the ``default``.  Each tier gives a row for
every key every tier takes (:data:`~kvtier.config.chain_config.TIER_KEYS`) and for
every option its backend declares, set or not; the chain gives a row for each
of its own keys (load policy, recording, metrics).  Values of secret options
are ``***`` whatever their source, unless empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from kvtier.config.chain_config import ChainConfig, TierConfig
from kvtier.config.units import format_duration
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
    for f in fields(TierConfig):
        if "kind" not in f.metadata:
            continue
        value = getattr(tier, f.name)
        text = "-" if index == 0 and f.name in _BELOW_ONLY else show(value)
        yield _origin(config, tier.name, f.name, text, f"{tier.path}.{f.name}")
    for key, opt in registry.options(tier.backend).items():
        value = tier.options.get(key)
        # an empty value holds no secret, and saying it is empty helps
        masked = key in tier.secret_options and value not in (None, "", {}, [])
        text = "***" if masked else show(value, opt.type)
        yield _origin(config, tier.name, key, text, f"{tier.path}.{key}")


def _chain_rows(config: ChainConfig) -> Iterator[Setting]:
    load, record, metrics = config.load, config.record, config.metrics
    recompute = load.recompute.describe() if load.recompute is not None else None
    shown: list[tuple[str, Any, str, tuple[str, ...]]] = [
        ("load_policy", load.policy, "", ()),
        ("recompute", recompute, "", ()),
        ("load_margin", load.margin, "", ()),
        ("cost_half_life", load.half_life, "duration", ()),
        # ``record: FILE`` is short for ``record: {path: FILE}``
        ("record.path", record.path if record else None, "", ("record",)),
        ("record.sample", record.sample if record else None, "", ()),
        ("metrics.prometheus_port", metrics.prometheus_port, "", ()),
        ("metrics.prometheus_host", metrics.prometheus_host, "", ()),
        ("metrics.log_interval", metrics.log_interval, "duration", ()),
    ]
    for key, value, kind, also in shown:
        yield _origin(config, CHAIN, key, show(value, kind), key, *also)
