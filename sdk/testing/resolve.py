"""Finding a backend for the kit by name or import path, and validating its options.

Kept free of pytest so the crash-safety child and ``kvtier conformance`` can
use it before (or without) starting pytest.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import Any

from kvtier.config import TIER_KEYS, load_config
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import ConfigError, PluginError

__all__ = ["resolve_backend", "validate_options"]


@functools.cache
def resolve_backend(spec: str) -> tuple[BackendRegistry, str]:
    """The registry that knows backend ``spec``, and its name there.

    ``spec`` is an entry-point name (``"host"``) or an import path of a
    zero-argument factory (``"my_pkg.backend:MyBackend"``), which is
    registered on a private registry so nothing global changes.  Raises
    :class:`~kvtier.spec.PluginError` with the reason when it cannot be found.
    """
    registry = BackendRegistry()
    if ":" not in spec:
        registry.info(spec)  # raises PluginError naming what is installed
        return registry, spec
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"backend {spec!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise PluginError(f"backend {spec!r}: {module_name!r} has no {attr!r}") from None
    if not callable(target):
        raise PluginError(f"backend {spec!r}: {attr!r} is not a class or factory")
    registry.register(spec, target)
    return registry, spec


def validate_options(spec: str, raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """``raw`` validated and completed as a chain would hand it to ``kvtier_open``."""
    tier_keys = sorted(set(raw) & TIER_KEYS)
    if tier_keys:
        raise ConfigError(
            f"{', '.join(tier_keys)} configure a chain's tier, not the backend; "
            "the kit tests backends alone",
            key=tier_keys[0],
        )
    registry, name = resolve_backend(spec)
    config = load_config({"chain": [{"name": "kit", "backend": name, **raw}]}, registry=registry)
    return config.tiers[0].options
