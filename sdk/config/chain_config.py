"""Tier-chain configuration: one YAML file (or dict) picks the tiers.

The file holds ``chain`` (tier entries, top to bottom), optionally ``metrics``
and ``version: 1``.  A tier takes the keys in :data:`TIER_KEYS` (the
fields of :class:`TierConfig` that carry a ``kind``); its other keys
are options of its backend, validated against ``kvtier_options`` and parsed
(sizes to bytes, durations to seconds).  ``${VAR}``, ``${VAR:-default}`` and
``$$`` are expanded in string values first.  Every error names the file, the
line and the key path (and the tier, inside one); values of secret options are
never shown.  Validation goes on past a problem, so that one run reports every
problem it can find, sorted by line (:func:`validate_config`); only a file
that cannot be read as YAML, or a document without a chain, stops it early.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from kvtier.config.load_policy import LoadConfig
from kvtier.config.nodes import read_yaml
from kvtier.config.record import RecordConfig
from kvtier.config.settings import CHAIN_OPTIONS, TIER_OPTIONS, Codec
from kvtier.plugins.options import (
    CheckedOptions,
    DeprecatedKey,
    FromText,
    describe_value,
    file_keys,
    old_keys,
    parse_option,
    parse_value,
    resolve_keys,
    user_key,
)
from kvtier.plugins.registry import BackendRegistry, default_registry
from kvtier.spec import ConfigError, Option, PluginError

__all__ = ["TIER_KEYS", "ChainConfig", "MetricsConfig", "TierConfig", "load_config",
           "sample_problem", "validate_config"]

#: The chain's own top-level keys: ``record`` and ``metrics`` hold their dotted ones.
_TOP_KEYS = ("chain", "metrics", "version",
             *dict.fromkeys(k.split(".")[0] for k in CHAIN_OPTIONS if "." not in k), "record")
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_VAR_RE = re.compile(r"\$\$|\$\{([^}]*)\}|\$\{")
_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LAST_PART_RE = re.compile(r"(\.[^.\[]*|\[\d+\])$")
def sample_problem(admit: int, share: float) -> str | None:
    """Why a tier's ``admit_sample: share`` cannot go with its ``admit``; ``None`` if it can."""
    if not 0.0 <= share <= 1.0:
        return f"expected a share from 0 to 1, got {share:g}"
    if share and admit < 2:
        return "has no meaning with admit: 1 (every block is written); set admit: 2 or more"
    return None


@dataclass(frozen=True)
class TierConfig:
    """One validated tier entry.

    Its fields are the keys every tier entry takes, parsed
    (:data:`~kvtier.config.settings.TIER_OPTIONS` declares them, and their
    defaults), and what the loader found out about the entry.
    """

    name: str
    backend: str
    #: Backend options: validated, parsed, defaults filled (``None`` if unset).
    options: Mapping[str, Any]
    #: The parts of the one ``codec`` key: the codec, its zstd level, its shuffle.
    codec: str = Codec().name
    codec_level: int = Codec().level
    #: ``"auto"`` or an element width.
    shuffle: str | int = Codec().shuffle
    write: str = "through"
    promote: bool = True
    verify: bool = True
    workers: int = 2
    #: Calls that must have named a key before traffic writes its block here.
    admit: int = 1
    #: Besides, the share of prompt lineages whose blocks are written here at first sight.
    admit_sample: float = 0.0
    #: Whether the chain fails to open where this tier's backend cannot open;
    #: otherwise the tier starts failed and is retried (:mod:`kvtier.chain.health`).
    required: bool = False
    #: Master key sources sealing this tier's blocks (:mod:`kvtier.block.crypt`), or none.
    encrypt: str = "none"
    where: str = "<dict>"
    #: Names of options declared secret: never print their values.
    secret_options: frozenset[str] = frozenset()
    #: The entry's key path, ``chain[1]``, for errors found later (at open).
    path: str = ""
    #: ``file:line`` of each backend option given in the entry.
    option_where: Mapping[str, str] = field(default_factory=dict)


#: Keys every tier entry accepts, whatever its backend (old keys included).
TIER_KEYS = frozenset({user_key(n, o) for n, o in TIER_OPTIONS.items()}
                      | {r.name for n, o in TIER_OPTIONS.items() for r in old_keys(n, o)})
#: The keys a tier entry may set only below the first tier.
_BELOW_ONLY = ("write", "admit", "admit_sample")


@dataclass(frozen=True)
class MetricsConfig:
    prometheus_port: int | None = None
    log_interval: float | None = None
    #: The address the Prometheus endpoint listens on: this host only unless told otherwise.
    prometheus_host: str = "127.0.0.1"
    #: Tenants with series of their own (kvtier.observe.tenant_metrics); the rest are 'other'.
    tenants_top: int = 20
    #: Seconds between two rankings of the tenants by bytes held.
    tenants_interval: float = 60.0


@dataclass(frozen=True)
class ChainConfig:
    tiers: tuple[TierConfig, ...]
    metrics: MetricsConfig
    source: str
    load: LoadConfig = field(default_factory=LoadConfig)
    record: RecordConfig | None = None
    #: ``file:line`` of every key path the source sets (``chain[1].url``), for ``explain``.
    given: Mapping[str, str] = field(default_factory=dict)
    #: The environment variables whose values went into each key path's value.
    env: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    registry: BackendRegistry | None = None,
) -> ChainConfig:
    """Read and validate a chain configuration from a YAML file path or a dict.

    Raises :class:`~kvtier.spec.ConfigError` naming ``file:line`` and the key
    path of the first problem by line; where there are several, its message
    goes on with every other one, a line each (``file:line: key: reason``).
    """
    config, problems = validate_config(source, registry=registry)
    if not problems:
        assert config is not None
        return config
    first, *rest = problems
    if not rest:
        raise first
    more = "\n".join(str(p) for p in rest)
    raise ConfigError(f"{first.reason}\n{more}", where=first.where, key=first.key) from first


def validate_config(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    registry: BackendRegistry | None = None,
) -> tuple[ChainConfig | None, list[ConfigError]]:
    """The configuration and every problem found in it, sorted by line.

    The configuration is ``None`` when there are problems.  Nothing is
    opened: backends' option checks do no I/O beyond a local ``stat``.
    """
    reg = registry if registry is not None else default_registry()
    if not isinstance(source, (str, os.PathLike)):
        return _Validator("<dict>", None, reg).run(source)
    label = os.fspath(source)
    try:
        data, lines, problems = read_yaml(label)
    except ConfigError as exc:
        return None, [exc]
    return _Validator(label, lines, reg, problems).run(data)


def _in_tier(problem: ConfigError, name: str, name_key: str) -> ConfigError:
    """``problem`` saying which tier it is in (not for the tier's name itself)."""
    if problem.key == name_key or problem.reason.endswith(f"(tier {name!r})"):
        return problem
    named = ConfigError(f"{problem.reason} (tier {name!r})", where=problem.where,
                        key=problem.key)
    named.__cause__, named.__suppress_context__ = problem.__cause__, True
    return named


class _Collect:
    def __init__(self, problems: list[ConfigError]) -> None:
        self.problems = problems

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, ConfigError):
            self.problems.append(exc)
            return True
        return False


class _Validator:
    """Validates plain values (from YAML or a dict); ``lines`` maps key paths to lines.

    A check that fails raises :class:`~kvtier.spec.ConfigError` through
    :meth:`fail`; :meth:`collect` records it and lets validation go on with
    the next key, so that every problem is reported at once.
    """

    def __init__(self, label: str, lines: dict[str, int] | None, registry: BackendRegistry,
                 problems: list[ConfigError] | None = None):
        self.label = label
        self.lines = lines
        self.registry = registry
        self.problems: list[ConfigError] = list(problems or ())
        self.env: dict[str, tuple[str, ...]] = {}

    def run(self, data: Any) -> tuple[ChainConfig | None, list[ConfigError]]:
        config = None
        with self.collect():
            config = self.chain(data)
        if not self.problems:
            return config, []
        # sorted by line, stably: problems on one line keep the order they were found
        return None, sorted(self.problems, key=self._line)

    def _line(self, problem: ConfigError) -> int:
        if self.lines is None or problem.where is None:
            return 0
        line = problem.where.rpartition(":")[2]
        return int(line) if line.isdigit() else 0

    def collect(self) -> _Collect:
        """A ``with`` block that records a problem raised inside, and goes on after it."""
        return _Collect(self.problems)

    def where(self, path: str) -> str:
        if self.lines is None:
            return self.label
        while path and path not in self.lines:  # a missing key: its parent's line
            trimmed = _LAST_PART_RE.sub("", path)
            path = "" if trimmed == path else trimmed
        return f"{self.label}:{self.lines.get(path, 1)}"

    def fail(self, path: str, reason: str) -> NoReturn:
        raise ConfigError(reason, where=self.where(path), key=path or None)

    def mapping(self, value: Any, path: str, what: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(path, f"expected {what}, got {describe_value(value)}")
        for key in value:
            if not isinstance(key, str):
                self.fail(path, f"mapping keys must be strings, got {key!r}")
        return value

    def unknown(self, path: str, key: str, accepted: list[str], extra: str = "") -> NoReturn:
        close = difflib.get_close_matches(key, accepted, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        self.fail(path, f"unknown key {key!r}{hint} Accepted{extra}: {', '.join(accepted)}")

    def chain(self, data: Any) -> ChainConfig:
        top = self.mapping(data, "", "a mapping with a 'chain' list")
        for key in top:
            if key not in _TOP_KEYS:
                with self.collect():
                    self.unknown(key, key, list(_TOP_KEYS))
        with self.collect():
            version = self.scalar(top.get("version"), "version", "int")
            if version is not None and version != 1:
                self.fail("version", f"unsupported configuration version {version}; "
                                     "this kvtier reads version 1")
        if "chain" not in top:
            self.fail("", "missing required key 'chain' (a list of tiers)")
        entries = top["chain"]
        if not isinstance(entries, (list, tuple)) or not entries:
            self.fail("chain", f"expected a non-empty list of tiers, got {describe_value(entries)}")
        tiers: list[TierConfig | None] = []
        seen: dict[str, str] = {}
        for i, entry in enumerate(entries):
            tier = None
            with self.collect():
                tier = self.tier(entry, f"chain[{i}]", first=i == 0, seen=seen)
            tiers.append(tier)
        settings = self.chain_settings(top)
        load = LoadConfig(settings["load_policy"], settings["recompute"],
                          settings["load_margin"], settings["cost_half_life"])
        record = None
        if settings["record.path"] is not None:
            sample = settings["record.sample"]
            record = RecordConfig(settings["record.path"], 1.0 if sample is None else sample)
        metrics = MetricsConfig(settings["metrics.prometheus_port"],
                                settings["metrics.log_interval"],
                                settings["metrics.prometheus_host"],
                                settings["metrics.tenants_top"],
                                settings["metrics.tenants_interval"])
        return ChainConfig(tuple(t for t in tiers if t is not None), metrics, self.label, load,
                           record, dict(self.given(top, "")), dict(self.env))

    def given(self, value: Any, path: str) -> Iterator[tuple[str, str]]:
        """``(key path, file:line)`` of every key under ``value``, at any depth."""
        items = (value.items() if isinstance(value, Mapping) else
                 enumerate(value) if isinstance(value, (list, tuple)) else ())
        for key, sub in items:
            inner = (f"{path}[{key}]" if isinstance(key, int) else
                     f"{path}.{key}" if path else str(key))
            yield inner, self.where(inner)
            yield from self.given(sub, inner)

    def chain_settings(self, top: Mapping[str, Any]) -> dict[str, Any]:
        """The chain's own keys (:data:`CHAIN_OPTIONS`) parsed, defaults filled."""
        given: dict[str, Any] = {}
        record = top.get("record")
        if isinstance(record, str):
            record = {"path": record}  # ``record: FILE`` is short for ``record: {path: FILE}``
        for group, value in (("record", record), ("metrics", top.get("metrics"))):
            if value is None:
                continue
            with self.collect():
                what = ("a path or a mapping with path and sample" if group == "record"
                        else "a mapping")
                entry = self.mapping(value, group, what)
                keys = [k.partition(".")[2] for k in CHAIN_OPTIONS if k.startswith(f"{group}.")]
                for key in entry:
                    if key not in keys:
                        with self.collect():
                            self.unknown(f"{group}.{key}", key, keys)
                given.update({f"{group}.{k}": v for k, v in entry.items() if k in keys})
        given.update({k: v for k, v in top.items() if k in CHAIN_OPTIONS})
        parsed: dict[str, Any] = {k: None for k in CHAIN_OPTIONS}
        for key, opt in CHAIN_OPTIONS.items():
            with self.collect():
                value = self.interpolate(given.get(key), key)
                parsed[key] = parse_option("chain", key, opt, value,
                                           functools.partial(self.fail, key))
        if record is not None and isinstance(record, Mapping) and not parsed["record.path"]:
            with self.collect():
                self.fail("record.path", "missing: the file the trace is appended to")
        defaults = LoadConfig()
        for key, default in (("load_margin", defaults.margin),
                             ("cost_half_life", defaults.half_life)):
            parsed[key] = default if parsed[key] is None else parsed[key]
        return parsed

    def tier(self, value: Any, path: str, *, first: bool,
             seen: dict[str, str]) -> TierConfig | None:
        """The tier entry at ``path``, or ``None`` where it has problems (all recorded)."""
        entry = self.mapping(value, path, "a tier mapping with 'name' and 'backend'")
        before = len(self.problems)
        name = self.tier_name(entry, path, seen)
        backend, declared = self.tier_backend(entry, path)
        if declared is not None:
            accepted = sorted({*file_keys(TIER_OPTIONS), *file_keys(declared)})
            known = TIER_KEYS | {k for n, o in declared.items()
                                 for k in (n, user_key(n, o), *(r.name for r in o.was))}
            for key in entry:
                if key not in known:
                    with self.collect():
                        self.unknown(f"{path}.{key}", key, accepted, f" for backend {backend!r}")
        kw = self.tier_keys(entry, path, first)
        options: dict[str, Any] = {}
        written: dict[str, str] = {}
        if declared is not None:
            values = self.names(entry, path, declared, TIER_KEYS, written)
            for key, opt in declared.items():
                at = f"{path}.{written.get(key, user_key(key, opt))}"
                with self.collect():
                    options[key] = parse_option(backend, key, opt, values.get(key),
                                                functools.partial(self.fail, at))
        if name is not None:  # say which tier, beside the key path
            self.problems[before:] = [_in_tier(p, name, f"{path}.name")
                                      for p in self.problems[before:]]
        if len(self.problems) > before or name is None or declared is None:
            return None
        return TierConfig(name=name, backend=backend, options=CheckedOptions(options, backend),
                          where=self.where(path), path=path,
                          option_where={k: self.where(f"{path}.{w}")
                                        for k, w in written.items()},
                          secret_options=frozenset(k for k, o in declared.items() if o.secret),
                          **kw)

    def tier_name(self, entry: Mapping[str, Any], path: str, seen: dict[str, str]) -> str | None:
        with self.collect():
            name = self.scalar(entry.get("name"), f"{path}.name", "str")
            if name is None:
                self.fail(f"{path}.name", "missing required key 'name'; "
                          "every tier needs a 'name' and a 'backend'")
            if not _NAME_RE.fullmatch(name):
                self.fail(f"{path}.name", f"invalid tier name {name!r}: use letters, digits, "
                          "'_', '.' and '-'")
            if name in seen:
                self.fail(f"{path}.name", f"duplicate tier name {name!r} "
                          f"(already used by {seen[name]} at {self.where(seen[name])})")
            seen[name] = path
            return str(name)
        return None

    def tier_backend(self, entry: Mapping[str, Any],
                     path: str) -> tuple[str, Mapping[str, Option] | None]:
        """The backend's name and its declared options (``None``: unknown or not given)."""
        backend = ""
        with self.collect():
            backend = self.scalar(entry.get("backend"), f"{path}.backend", "str")
            if backend is None:
                self.fail(f"{path}.backend", "missing required key 'backend'; "
                          "every tier needs a 'name' and a 'backend'")
            return backend, self.backend_options(backend, f"{path}.backend")
        return backend or "", None

    def names(self, entry: Mapping[str, Any], path: str, declared: Mapping[str, Option],
              skip: frozenset[str], written: dict[str, str]) -> dict[str, Any]:
        """The entry's keys of ``declared`` (not those in ``skip``), interpolated, by declared
        name: old keys merged, with a warning naming the new one; ``written`` gets the key
        each declared name was given under."""
        secret = {k: o.secret for n, o in declared.items()
                  for k in (n, user_key(n, o), *(r.name for r in o.was))}
        values: dict[str, Any] = {}
        for key, value in entry.items():
            if key in skip or key not in secret:
                continue
            with self.collect():
                values[key] = self.interpolate(value, f"{path}.{key}", secret[key])
        for name, opt in declared.items():
            for key in (user_key(name, opt), *(r.name for r in old_keys(name, opt))):
                if key in values:
                    written.setdefault(name, key)

        def fail(key: str, reason: str) -> NoReturn:
            self.fail(f"{path}.{key}", reason)

        def warn(key: str, message: str) -> None:
            where = self.where(f"{path}.{key}")
            warnings.warn(DeprecatedKey(f"{where}: {path}.{key}: {message}"), stacklevel=2)

        with self.collect():
            return resolve_keys("a tier", declared, values, fail, warn, from_file=True)
        return {}

    def tier_keys(self, entry: Mapping[str, Any], path: str, first: bool) -> dict[str, Any]:
        """The keys every tier takes (:data:`TIER_OPTIONS`), parsed, defaults filled."""
        given = self.names(entry, path, TIER_OPTIONS, frozenset(), {})
        for below_only in _BELOW_ONLY:
            if first and given.get(below_only) is not None:
                with self.collect():
                    self.fail(f"{path}.{below_only}", f"'{below_only}' has no meaning on the "
                              "first tier (it sets how a tier is written from the tier above)")
        kw: dict[str, Any] = {}
        for key, opt in TIER_OPTIONS.items():
            if key in ("name", "backend"):  # read apart
                continue
            with self.collect():
                kw[key] = parse_option("tier", key, opt, given.get(key),
                                       functools.partial(self.fail, f"{path}.{key}"))
        codec = kw.pop("codec", None) or Codec()
        kw.update(codec=codec.name, codec_level=codec.level, shuffle=codec.shuffle)
        with self.collect():
            # on the first tier it was refused above; the admit it goes with is checked here
            problem = sample_problem(2 if first else kw.get("admit", 1),
                                     kw.get("admit_sample", 0.0))
            if problem is not None:
                del kw["admit_sample"]
                self.fail(f"{path}.admit_sample", problem)
        return {k: v for k, v in kw.items() if v is not None}

    def backend_options(self, backend: str, path: str) -> Mapping[str, Option]:
        try:
            declared = self.registry.options(backend)
        except PluginError as exc:
            raise ConfigError(str(exc), where=self.where(path), key=path) from exc
        bad = [k for k, o in declared.items()
               if k in TIER_KEYS or user_key(k, o) in TIER_KEYS or not isinstance(o, Option)]
        if bad:
            raise PluginError(f"backend {backend!r} declares invalid option(s) {', '.join(bad)}: "
                              "options must be kvtier.spec.Option and not reuse tier keys")
        return declared

    def scalar(self, value: Any, path: str, kind: str, *,
               choices: tuple[Any, ...] | None = None, secret: bool = False) -> Any:
        """Interpolate, then parse ``value`` as ``kind``; ``None`` stays ``None``."""
        value = self.interpolate(value, path, secret)
        if value is None:
            return None
        return parse_value(kind, value, lambda reason: self.fail(path, reason),
                           choices=choices, secret=secret)

    def interpolate(self, value: Any, path: str, secret: bool = False) -> Any:
        if isinstance(value, str):
            return self.expand(value, path, secret)
        if isinstance(value, (list, tuple)):
            return [self.interpolate(v, f"{path}[{i}]", secret) for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            return {k: self.interpolate(v, f"{path}.{k}", secret) for k, v in value.items()}
        return value

    def expand(self, text: str, path: str, secret: bool) -> str:
        substituted = False

        def one(m: re.Match[str]) -> str:
            nonlocal substituted
            body = m.group(1)
            if m.group(0) == "$$":
                return "$"
            if body is None:
                self.fail(path, "unterminated '${' (write '$$' for a literal '$')")
            name, sep, default = body.partition(":-")
            if not _VAR_NAME_RE.fullmatch(name):
                shown = "" if secret else f" ${{{body}}}"
                self.fail(path, f"invalid variable reference{shown}; "
                                "expected ${NAME} or ${NAME:-default}")
            found = os.environ.get(name)
            if found is None and not sep:
                self.fail(path, f"environment variable {name} is not set "
                                f"(use ${{{name}:-default}} for a fallback)")
            substituted = True
            if found or (found is not None and not sep):  # not the file's fallback
                self.env[path] = (*self.env.get(path, ()), name)
            return found if found else default if sep else ""

        result = _VAR_RE.sub(one, text) if "$" in text else text
        return FromText(result) if substituted else result
