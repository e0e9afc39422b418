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

import contextlib
import difflib
import functools
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, NoReturn

from kvtier.block.framing import CODECS, SHUFFLE_WIDTHS, ZSTD_LEVELS
from kvtier.config.load_policy import LOAD_KEYS, LoadConfig, parse_load
from kvtier.config.nodes import read_yaml
from kvtier.config.record import RECORD_KEYS, RecordConfig, parse_record
from kvtier.plugins.options import (
    CheckedOptions,
    FromText,
    convert,
    describe_value,
    parse_option,
    parse_value,
)
from kvtier.plugins.registry import BackendRegistry, default_registry
from kvtier.spec import ConfigError, Option, PluginError

__all__ = ["TIER_KEYS", "ChainConfig", "MetricsConfig", "TierConfig", "load_config",
           "sample_problem", "validate_config"]

_TOP_KEYS = ("chain", "metrics", "version", *LOAD_KEYS, *RECORD_KEYS)
_METRICS_KEYS = ("prometheus_port", "prometheus_host", "log_interval")
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_VAR_RE = re.compile(r"\$\$|\$\{([^}]*)\}|\$\{")
_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LAST_PART_RE = re.compile(r"(\.[^.\[]*|\[\d+\])$")
#: What a tier's ``shuffle`` takes besides ``auto``: 0 and 1 turn it off.
_SHUFFLE_SETTINGS = (0, 1, *SHUFFLE_WIDTHS)


def _tier_key(kind: str, choices: tuple[Any, ...] | None = None) -> Mapping[str, Any]:
    """Metadata marking a :class:`TierConfig` field as a tier key, parsed as ``kind``."""
    return MappingProxyType({"kind": kind, "choices": choices})


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

    The fields whose metadata is a ``_tier_key`` are the keys every tier entry takes,
    whatever its backend (:data:`TIER_KEYS`): their kind, choices and
    defaults are stated here only.
    """

    name: str = field(metadata=_tier_key("str"))
    backend: str = field(metadata=_tier_key("str"))
    #: Backend options: validated, parsed, defaults filled (``None`` if unset).
    options: Mapping[str, Any]
    codec: str = field(default="none", metadata=_tier_key("str", tuple(CODECS)))
    codec_level: int = field(default=1, metadata=_tier_key("int"))
    #: ``"auto"`` or an element width; see :meth:`_Validator.shuffle`.
    shuffle: str | int = field(default="auto", metadata=_tier_key("shuffle"))
    write: str = field(default="through", metadata=_tier_key("str", ("through", "back")))
    promote: bool = field(default=True, metadata=_tier_key("bool"))
    verify: bool = field(default=True, metadata=_tier_key("bool"))
    workers: int = field(default=2, metadata=_tier_key("int"))
    #: Calls that must have named a key before traffic writes its block here.
    admit: int = field(default=1, metadata=_tier_key("int"))
    #: Besides, the share of prompt lineages whose blocks are written here at first sight.
    admit_sample: float = field(default=0.0, metadata=_tier_key("float"))
    #: Whether the chain fails to open where this tier's backend cannot open;
    #: otherwise the tier starts failed and is retried (:mod:`kvtier.chain.health`).
    required: bool = field(default=False, metadata=_tier_key("bool"))
    where: str = "<dict>"
    #: Names of options declared secret: never print their values.
    secret_options: frozenset[str] = frozenset()
    #: The entry's key path, ``chain[1]``, for errors found later (at open).
    path: str = ""
    #: ``file:line`` of each backend option given in the entry.
    option_where: Mapping[str, str] = field(default_factory=dict)


#: The fields a tier entry sets, in declaration order.
_TIER_FIELDS = tuple(f for f in fields(TierConfig) if "kind" in f.metadata)
#: Keys every tier entry accepts, whatever its backend.
TIER_KEYS = frozenset(f.name for f in _TIER_FIELDS)
_TIER_DEFAULTS = MappingProxyType({f.name: f.default for f in _TIER_FIELDS})


@dataclass(frozen=True)
class MetricsConfig:
    prometheus_port: int | None = None
    log_interval: float | None = None
    #: The address the Prometheus endpoint listens on: this host only unless told otherwise.
    prometheus_host: str = "127.0.0.1"


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
        metrics = MetricsConfig()
        with self.collect():
            metrics = self.metrics(top.get("metrics"))
        load = LoadConfig()
        with self.collect():
            load = parse_load(top, self.scalar, self.fail)
        record = None
        with self.collect():
            record = parse_record(top, self.scalar, self.fail)
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

    def metrics(self, value: Any) -> MetricsConfig:
        if value is None:
            return MetricsConfig()
        entry = self.mapping(value, "metrics", "a mapping")
        for key in entry:
            if key not in _METRICS_KEYS:
                with self.collect():
                    self.unknown(f"metrics.{key}", key, list(_METRICS_KEYS))
        port = interval = None
        with self.collect():
            port = self.scalar(entry.get("prometheus_port"), "metrics.prometheus_port", "int")
            if port is not None and not 1 <= port <= 65535:
                self.fail("metrics.prometheus_port", f"expected a port 1..65535, got {port}")
        with self.collect():
            interval = self.scalar(entry.get("log_interval"), "metrics.log_interval", "duration")
            if interval is not None and interval <= 0:
                self.fail("metrics.log_interval", "must be longer than 0s")
        host = MetricsConfig.prometheus_host
        with self.collect():
            given = self.scalar(entry.get("prometheus_host"), "metrics.prometheus_host", "str")
            if given is not None and not given.strip():
                self.fail("metrics.prometheus_host", "expected an address such as 127.0.0.1 "
                          "or 0.0.0.0 (every interface), got an empty string")
            host = given or host
        return MetricsConfig(port, interval, host)

    def tier(self, value: Any, path: str, *, first: bool,
             seen: dict[str, str]) -> TierConfig | None:
        """The tier entry at ``path``, or ``None`` where it has problems (all recorded)."""
        entry = self.mapping(value, path, "a tier mapping with 'name' and 'backend'")
        before = len(self.problems)
        name = self.tier_name(entry, path, seen)
        backend, declared = self.tier_backend(entry, path)
        if declared is not None:
            accepted = sorted(TIER_KEYS | set(declared))
            for key in entry:
                if key not in TIER_KEYS and key not in declared:
                    with self.collect():
                        self.unknown(f"{path}.{key}", key, accepted, f" for backend {backend!r}")
        kw = self.tier_keys(entry, path, first)
        options: dict[str, Any] = {}
        for key, opt in (declared or {}).items():
            with self.collect():
                value = self.interpolate(entry.get(key), f"{path}.{key}", opt.secret)
                options[key] = parse_option(backend, key, opt, value,
                                            functools.partial(self.fail, f"{path}.{key}"))
        if name is not None:  # say which tier, beside the key path
            self.problems[before:] = [_in_tier(p, name, f"{path}.name")
                                      for p in self.problems[before:]]
        if len(self.problems) > before or name is None or declared is None:
            return None
        return TierConfig(name=name, backend=backend, options=CheckedOptions(options, backend),
                          where=self.where(path), path=path,
                          option_where={k: self.where(f"{path}.{k}") for k in entry
                                        if k in declared},
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

    def tier_keys(self, entry: Mapping[str, Any], path: str, first: bool) -> dict[str, Any]:
        """The keys every tier takes (:data:`TIER_KEYS`) that the entry sets, parsed."""
        for below_only in ("write", "admit", "admit_sample"):
            if first and entry.get(below_only) is not None:
                with self.collect():
                    self.fail(f"{path}.{below_only}", f"'{below_only}' has no meaning on the "
                              "first tier (it sets how a tier is written from the tier above)")
        kw: dict[str, Any] = {}
        for tier_key in _TIER_FIELDS[2:]:  # name and backend are read apart
            key, kind = tier_key.name, tier_key.metadata["kind"]
            with self.collect():
                if kind == "shuffle":
                    kw[key] = self.shuffle(entry.get(key), f"{path}.{key}")
                    continue
                val = self.scalar(entry.get(key), f"{path}.{key}", kind,
                                  choices=tier_key.metadata["choices"])
                if val is not None:
                    kw[key] = val
        with self.collect():
            level = kw.get("codec_level", _TIER_DEFAULTS["codec_level"])
            if level not in ZSTD_LEVELS:
                del kw["codec_level"]
                self.fail(f"{path}.codec_level", f"zstd levels run from {ZSTD_LEVELS[0]} to "
                          f"{ZSTD_LEVELS[-1]}, got {level}")
        with self.collect():
            workers = kw.get("workers", _TIER_DEFAULTS["workers"])
            if not 1 <= workers <= 64:
                del kw["workers"]
                self.fail(f"{path}.workers", f"expected 1 to 64 threads, got {workers}")
        with self.collect():
            if kw.get("admit", 1) < 1:
                del kw["admit"]
                self.fail(f"{path}.admit", "expected 1 (write every block) or more calls")
        with self.collect():
            # on the first tier it was refused above; the admit it goes with is checked here
            problem = sample_problem(2 if first else kw.get("admit", 1),
                                     kw.get("admit_sample", 0.0))
            if problem is not None:
                del kw["admit_sample"]
                self.fail(f"{path}.admit_sample", problem)
        return kw

    def backend_options(self, backend: str, path: str) -> Mapping[str, Option]:
        try:
            declared = self.registry.options(backend)
        except PluginError as exc:
            raise ConfigError(str(exc), where=self.where(path), key=path) from exc
        bad = [k for k, o in declared.items() if k in TIER_KEYS or not isinstance(o, Option)]
        if bad:
            raise PluginError(f"backend {backend!r} declares invalid option(s) {', '.join(bad)}: "
                              "options must be kvtier.spec.Option and not reuse tier keys")
        return declared

    def shuffle(self, value: Any, path: str) -> str | int:
        value = self.interpolate(value, path)
        if value is None:
            return "auto"
        if isinstance(value, FromText):
            with contextlib.suppress(ValueError):
                value = convert("int", value)
        if value == "auto" or (type(value) is int and value in _SHUFFLE_SETTINGS):
            return str(value) if isinstance(value, str) else value
        *most, last = _SHUFFLE_SETTINGS
        self.fail(path, f"expected 'auto' or an element size {', '.join(map(str, most))} or "
                        f"{last} (0 and 1 turn shuffling off), got {describe_value(value)}")

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
