"""Every setting a user can meet, from the declarations.

Run ``python tests/support/settings_inventory.py``: a script, beside the tests, since it
reads kvtier and its integrations and no package of kvtier may import both.

A setting is a key a person may write: the chain's own keys, the keys every
tier takes, each built-in backend's options and kvtier-redis's (where
installed), and the options of vLLM's ``secondary_tiers`` entry.  An option
several backends share (:mod:`kvtier.spec.shared`: declared once, with a
``key``; or one declaration object that several backends name) is one
setting, in scope ``shared``.  Old keys still read for a release, and options
only kvtier's commands set (:attr:`~kvtier.spec.Option.internal`), are no
settings: :func:`old_keys` lists the first, :func:`internal` the second.

The same script, run at the commit before the options were declared once
(``1bfe5d1``, where the tier keys were ``TierConfig`` metadata and the load
policy and record keys hand-written), finds the 87 settings of then: it reads
whichever declarations the tree has.  It lives beside the tests, not in
:mod:`kvtier.config`, because it reads vLLM's integration too, which no package
of kvtier imports.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from kvtier.plugins.registry import BackendRegistry, default_registry
from kvtier.spec import Option

__all__ = ["BACKENDS", "Row", "internal", "old_keys", "settings"]

#: The backends whose options count: the built-in ones and kvtier-redis.
BACKENDS = ("host", "fs", "object", "peer", "redis")


class Row(NamedTuple):
    """One setting: where it is written (``chain``, ``tier``, ``shared``, a backend,
    ``vllm``) and its key."""

    scope: str
    key: str


def _backends(registry: BackendRegistry) -> Iterator[tuple[str, Mapping[str, Option]]]:
    for name in BACKENDS:
        if name in registry.names():
            yield name, registry.options(name)


def _vllm_options() -> list[str]:
    try:
        from kvtier.contrib.vllm import tier_options
    except ImportError:  # vLLM's integration imports nothing of vLLM here; never expected
        return []
    declared = getattr(tier_options, "OPTIONS", None)
    if declared is not None:
        return list(declared)
    return list(tier_options.TierOptions.__dataclass_fields__)  # before: a dataclass


def _chain_and_tier() -> tuple[list[str], list[str]]:
    try:
        from kvtier.config.settings import CHAIN_OPTIONS, TIER_OPTIONS
    except ImportError:  # before: TierConfig metadata and hand-written parsers
        import importlib

        loader = importlib.import_module("kvtier.config.loader")
        load = importlib.import_module("kvtier.config.load")
        chain = [*load.LOAD_KEYS, "record.path", "record.sample",
                 *(f"metrics.{k}" for k in loader._METRICS_KEYS)]
        return chain, sorted(loader.TIER_KEYS)
    return list(CHAIN_OPTIONS), [_key(n, o) for n, o in TIER_OPTIONS.items() if not _internal(o)]


def _key(name: str, opt: Option) -> str:
    return getattr(opt, "key", None) or name


def _internal(opt: Option) -> bool:
    return bool(getattr(opt, "internal", False))


def settings(registry: BackendRegistry | None = None) -> list[Row]:
    """Every setting, once: the chain's, the tier keys, the shared options, each backend's
    own, vLLM's."""
    reg = registry if registry is not None else default_registry()
    chain, tier = _chain_and_tier()
    rows = [Row("chain", k) for k in chain] + [Row("tier", k) for k in tier]
    declared = list(_backends(reg))
    named_by: dict[int, int] = {}  # a declaration object several backends name is shared
    for _, options in declared:
        for opt in options.values():
            named_by[id(opt)] = named_by.get(id(opt), 0) + 1
    shared: list[Row] = []
    own: list[Row] = []
    for backend, options in declared:
        for name, opt in options.items():
            if _internal(opt):
                continue
            key = _key(name, opt)
            if getattr(opt, "key", None) or named_by[id(opt)] > 1:
                if Row("shared", key) not in shared:
                    shared.append(Row("shared", key))
            else:
                own.append(Row(backend, key))
    return rows + shared + own + [Row("vllm", k) for k in _vllm_options()]


def pairs(registry: BackendRegistry | None = None) -> list[Row]:
    """The stricter count: each backend's options one by one, shared ones in every backend
    that takes them."""
    reg = registry if registry is not None else default_registry()
    chain, tier = _chain_and_tier()
    rows = [Row("chain", k) for k in chain] + [Row("tier", k) for k in tier]
    rows += [Row(b, _key(n, o)) for b, options in _backends(reg)
             for n, o in options.items() if not _internal(o)]
    return rows + [Row("vllm", k) for k in _vllm_options()]


def old_keys(registry: BackendRegistry | None = None) -> dict[tuple[str, str], str]:
    """``(scope, old key) -> new key`` for every old key still read (with a warning)."""
    reg = registry if registry is not None else default_registry()
    out: dict[tuple[str, str], str] = {}
    try:
        from kvtier.config.settings import TIER_OPTIONS
    except ImportError:
        return out
    groups: list[tuple[str, Mapping[str, Any]]] = [("tier", TIER_OPTIONS), *_backends(reg)]
    for scope, options in groups:
        for name, opt in options.items():
            key = _key(name, opt)
            if key != name:
                out[(scope, name)] = key
            for renamed in getattr(opt, "was", ()):
                out[(scope, renamed.name)] = key
    return out


def internal(registry: BackendRegistry | None = None) -> list[Row]:
    """The options only kvtier's commands set, or that are derived: no settings of a file."""
    reg = registry if registry is not None else default_registry()
    return [Row(b, n) for b, options in _backends(reg) for n, o in options.items()
            if _internal(o)]


def main(argv: list[str]) -> int:
    rows = settings()
    for row in rows:
        print(f"{row.scope:8} {row.key}")
    print(f"{len(rows)} settings ({len(pairs())} counting each backend's shared options "
          f"apart); {len(old_keys())} old keys still read, {len(internal())} options set by "
          "kvtier's commands only")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
