"""Backend options: values parsed against the :class:`~kvtier.spec.Option` a backend declares.

One implementation serves both places options are checked: the config loader
(which adds the file, line and key path to every error) and
:meth:`~kvtier.plugins.registry.BackendHandle.open`, which every open of a
backend passes through, so ``kvtier_open`` always receives checked values
with defaults filled, whoever opens it (a chain, the conformance kit, a test).
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

from kvtier.spec import ConfigError, Option, PluginError, Renamed

__all__ = [
    "CheckedOptions",
    "DeprecatedKey",
    "FromText",
    "NotFinite",
    "check_options",
    "convert",
    "describe_value",
    "file_keys",
    "finite",
    "old_keys",
    "parse_duration",
    "parse_option",
    "parse_size",
    "parse_value",
    "resolve_keys",
    "user_key",
    "with_values",
]

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "p": 1000**5,
    "pb": 1000**5,
    "e": 1000**6,
    "eb": 1000**6,
    "pib": 1024**5,
    "eib": 1024**6,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|)\s*$")


def parse_size(value: object) -> int:
    """Bytes from an ``int`` or a string like ``8GiB``, ``1.5 GB``, ``4096``.

    Binary units (KiB, MiB, GiB, TiB, PiB, EiB) are powers of 1024, decimal
    ones (KB, MB, GB, TB, PB, EB, and single letters) powers of 1000.  Raises ``ValueError``
    with the accepted forms for anything else, including negative sizes.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 8GiB or 4096, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match:
            unit = match.group(2).lower()
            if unit in _SIZE_UNITS:
                return int(finite(float(match.group(1)) * _SIZE_UNITS[unit], value))
    raise ValueError(f"expected a size such as 8GiB, 500MB or 4096 (bytes), got {value!r}")


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like ``250ms``, ``2s``, ``1m``, ``1h``, ``7d``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 250ms or 2s, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = finite(value)
        if seconds < 0:
            raise ValueError(f"a duration cannot be negative, got {value}")
        return seconds
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match:
            return finite(float(match.group(1)) * _DURATION_UNITS[match.group(2)], value)
    raise ValueError(f"expected a duration such as 250ms, 2s or 1m, got {value!r}")


class NotFinite(ValueError):
    """A number that is NaN or infinite: its message is the whole reason."""


def finite(value: Any, given: object = None) -> float:
    """``float(value)``, unless that is NaN or infinite: ``NotFinite``, showing ``given``
    (by default ``value``).  A ``str`` that is no number raises ``ValueError``.

    NaN compares false with everything, so it passes every range check after
    it (a NaN margin declines every load); infinity overflows what it sizes.
    """
    given = value if given is None else given
    try:
        number = float(value)
    except OverflowError:  # an int beyond a float's range
        number = math.inf
    if not math.isfinite(number):
        shown = repr(given) if isinstance(given, str) else str(given)
        raise NotFinite(f"expected a finite number, got {shown}")
    return number


_INT_RE = re.compile(r"\s*[+-]?\d+\s*")
_PERCENT_RE = re.compile(r"\s*\d+(?:\.\d+)?\s*%\s*")
_BOOLS = {"true": True, "yes": True, "on": True, "1": True,
          "false": False, "no": False, "off": False, "0": False}
_EXPECTED = {
    "str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
    "size": "a size such as 8GiB, 500MB or 4096 (bytes)",
    "size_or_percent": "a size such as 8GiB, 500MB or 4096 (bytes), or a percent such as 10%",
    "duration": "a duration such as 250ms, 2s or 1m",
    "list": "a list (or one string of comma-separated items)", "map": "a mapping",
}

#: Raises the error for one value, given the reason; adds where it was.
Fail = Callable[[str], NoReturn]


class FromText(str):
    """A string standing for a value of any type (from ``${VAR}``), so it may be read
    as an int, a float or a bool; a plain ``str`` is only ever a string."""

    __slots__ = ()


class CheckedOptions(Mapping[str, Any]):
    """Options of ``backend`` checked against its declaration, defaults filled: read-only."""

    __slots__ = ("_values", "backend")

    def __init__(self, values: Mapping[str, Any], backend: str) -> None:
        self._values = dict(values)
        self.backend = backend

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"CheckedOptions({self.backend!r}, {sorted(self._values)})"


def with_values(options: Mapping[str, Any], **values: Any) -> Mapping[str, Any]:
    """``options`` and ``values`` (parsed already, such as an internal option's), still
    :class:`CheckedOptions` where ``options`` were: an open checks them no second time."""
    merged = {**options, **values}
    if isinstance(options, CheckedOptions):
        return CheckedOptions(merged, options.backend)
    return merged


class DeprecatedKey(FutureWarning):
    """An old key, still read for a release: the message names the key to write instead.

    A ``FutureWarning``, so that Python shows it to the people who wrote the
    key (a ``DeprecationWarning`` is hidden outside ``__main__``).
    """


def user_key(name: str, opt: Option) -> str:
    """The key a file writes for the option declared as ``name``."""
    return opt.key or name


def old_keys(name: str, opt: Option) -> tuple[Renamed, ...]:
    """The option's old keys: its declared name where it is not the key, then :attr:`was`."""
    own = (Renamed(name),) if opt.key and opt.key != name else ()
    return own + opt.was


def file_keys(declared: Mapping[str, Option]) -> list[str]:
    """The keys a file may write for ``declared`` (old keys and internal options left out)."""
    return [user_key(n, o) for n, o in declared.items() if not o.internal]


#: Reports one problem: ``(key as written, reason)``.
FailAt = Callable[[str, str], NoReturn]
#: Reports an old key or an internal option given: ``(key as written, what to do instead)``.
Warn = Callable[[str, str], None]


def resolve_keys(what: str, declared: Mapping[str, Option], values: Mapping[str, Any],
                 fail: FailAt, warn: Warn, *, from_file: bool,
                 written: dict[str, str] | None = None) -> dict[str, Any]:
    """``values`` (by the keys written) by declared name, old keys merged into their new ones.

    The one place an option's names are read: the key a file writes
    (:attr:`~kvtier.spec.Option.key`), the name the backend declares and reads,
    and the old keys (:attr:`~kvtier.spec.Option.was`).  An old key given is
    ``warn``-ed with the new key; an option only kvtier's commands set
    (:attr:`~kvtier.spec.Option.internal`) too, where ``from_file``.  An
    unknown key, a value given under two names, or an old value that
    contradicts the new key's is ``fail``-ed.  ``written`` gets the key each
    declared name was given under, for errors found later.
    """
    known = {user_key(n, o) for n, o in declared.items()}
    known |= {r.name for n, o in declared.items() for r in old_keys(n, o)}
    for key in values:
        if key not in known:
            accepted = file_keys(declared)
            close = difflib.get_close_matches(str(key), accepted, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            fail(str(key), f"is not an option of {what}{hint} "
                           f"(accepted: {', '.join(sorted(accepted)) or 'none'})")
    out: dict[str, Any] = {}
    for name, opt in declared.items():
        new = user_key(name, opt)
        value = values.get(new)
        if value is not None and written is not None:
            written[name] = new
        for old in old_keys(name, opt):
            if values.get(old.name) is None:
                continue
            if written is not None:
                written.setdefault(name, old.name)
            warn(old.name, f"{old.name!r} is deprecated and goes in the next release: "
                           f"write {new!r} instead (docs/settings.md)")
            if old.merge is None:
                if value is not None:
                    fail(old.name, f"{old.name!r} is the old name of {new!r}: give only {new!r}")
                value = values[old.name]
                continue
            parsed = values[old.name]  # as written, where the merge reads it itself
            if old.type is not None:
                parsed = parse_value(old.type, parsed, functools.partial(fail, old.name))
            elif isinstance(parsed, FromText):
                parsed = str(parsed)
            try:
                value = old.merge(parsed, value)
            except ValueError as exc:
                fail(old.name, str(exc))
        if opt.internal and from_file and values.get(new) is not None:
            warn(new, f"{new!r} is no setting of a file and goes in the next release: "
                      f"{opt.help}")
        out[name] = value
    return out


def check_options(
    backend: str, declared: Mapping[str, Option], values: Mapping[str, Any]
) -> CheckedOptions:
    """``values`` checked and completed against ``declared``, as ``kvtier_open`` receives them.

    Options that already are :class:`CheckedOptions` of this backend (a chain's,
    checked by the config loader) are returned as they are.  Errors are
    :class:`~kvtier.spec.ConfigError` with ``key`` the option's key.  A value
    may be given under the option's key or its declared name; an old key
    warns (:class:`DeprecatedKey`).
    """
    if isinstance(values, CheckedOptions) and values.backend == backend:
        return values

    def fail_at(key: str, reason: str) -> NoReturn:
        raise ConfigError(reason, key=key)

    def warn(key: str, message: str) -> None:
        warnings.warn(DeprecatedKey(f"backend {backend!r}: {message}"), stacklevel=4)

    written: dict[str, str] = {}
    named = resolve_keys(f"backend {backend!r}", declared, values, fail_at, warn,
                         from_file=False, written=written)
    checked: dict[str, Any] = {}
    for name, opt in declared.items():
        def fail(reason: str, key: str = written.get(name, user_key(name, opt))) -> NoReturn:
            raise ConfigError(reason, key=key)

        checked[name] = parse_option(backend, name, opt, named[name], fail)
    return CheckedOptions(checked, backend)


def parse_option(backend: str, name: str, opt: Option, value: Any, fail: Fail) -> Any:
    """One option's value: parsed, in its choices, passed by its check; or its default."""
    if value is None and opt.required:
        fail(f"missing required option of backend {backend!r}: {opt.help}")
    if value is None:
        if opt.default is None:
            return None
        try:
            return opt.parse(opt.default) if opt.parse else convert(opt.type, opt.default)
        except ValueError:
            raise PluginError(f"backend {backend!r}: option {name!r} "
                              f"has an invalid default for type {opt.type}") from None
    if opt.parse is not None:
        try:
            parsed = opt.parse(str(value) if isinstance(value, FromText) else value)
        except NotFinite as exc:
            fail(str(exc))
        except ValueError as exc:
            fail(str(exc) if not opt.secret else "rejected (details hidden: secret option)")
        if opt.choices is not None and parsed not in opt.choices:
            fail(f"expected one of {', '.join(map(repr, opt.choices))}, "
                 f"got {describe_value(value, opt.secret)}")
    else:
        parsed = parse_value(opt.type, value, fail, choices=opt.choices, secret=opt.secret)
    if opt.check is not None:
        try:
            opt.check(parsed)
        except ValueError as exc:
            reason = str(exc) or "rejected"
            if opt.secret and any(str(v) in reason for v in (value, parsed) if str(v)):
                reason = "rejected by the backend (details hidden: secret option)"
            fail(reason)
    return parsed


def parse_value(kind: str, value: Any, fail: Fail, *,
                choices: tuple[Any, ...] | None = None, secret: bool = False) -> Any:
    """``value`` parsed as ``kind`` and among ``choices``; else ``fail`` says what was wanted."""
    try:
        parsed = convert(kind, value)
    except NotFinite as exc:
        fail("expected a finite number (value hidden: secret option)" if secret else str(exc))
    except ValueError:
        fail(f"expected {_EXPECTED.get(kind, kind)}, got {describe_value(value, secret)}")
    if choices is not None and parsed not in choices:
        fail(f"expected one of {', '.join(map(repr, choices))}, "
             f"got {describe_value(value, secret)}")
    return parsed


def convert(kind: str, value: Any) -> Any:
    """Parse ``value`` as an option type; ``ValueError`` if it is not one."""
    text, number = isinstance(value, FromText), type(value) in (int, float)
    if kind == "str" and isinstance(value, str):
        return str(value)
    if kind == "int" and (type(value) is int or (text and _INT_RE.fullmatch(value))):
        return int(value)
    if kind == "float" and (number or text):
        return finite(value)  # a FromText that is no number raises ValueError
    if kind == "bool" and (isinstance(value, bool) or (text and value.strip().lower() in _BOOLS)):
        return value if isinstance(value, bool) else _BOOLS[value.strip().lower()]
    if kind in ("size", "duration"):
        return parse_size(value) if kind == "size" else parse_duration(value)
    if kind == "size_or_percent":
        if isinstance(value, str) and _PERCENT_RE.fullmatch(value):
            return str(value).strip()  # the backend reads the share: "10%"
        return parse_size(value)  # an integer as everywhere a size is read
    if kind == "list" and isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if kind == "list" and isinstance(value, str):
        # one string is a list of its comma-separated items: `peers=host:port`
        # on a command line, or `${PEERS}` from the environment
        return [item.strip() for item in str(value).split(",") if item.strip()]
    if kind == "map" and isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    raise ValueError(kind)


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return str(value) if isinstance(value, FromText) else value


def describe_value(value: Any, secret: bool = False) -> str:
    """``value`` as an error message shows it after "got"."""
    if secret:
        return f"a {type(value).__name__} (value hidden: secret option)"
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list" if value else "an empty list"
    text = repr(str(value) if isinstance(value, str) else value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return text if isinstance(value, str) else f"{type(value).__name__} {text}"
