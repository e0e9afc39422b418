"""Backend discovery and loading.

Backends, built-in or third-party, are found through one entry-point group,
``kvtier.backends``, whose values name a class (or any zero-argument
callable) producing a plugin object.  Nothing is imported until a backend is
first needed.  ``KVTIER_DISABLE_PLUGINS=name1,name2`` hides named backends.

Each tier gets its own pluggy plugin manager holding exactly one backend
instance, so two tiers of one backend never answer each other's calls; the
manager validates the instance against :mod:`kvtier.spec.hookspecs`.
The rest of kvtier talks to a backend only through :class:`BackendHandle`,
whose ``open`` checks the options (:mod:`kvtier.plugins.options`).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import os
import threading
from collections.abc import Callable, Iterator, Mapping, MutableSequence, Sequence
from dataclasses import dataclass
from typing import Any

import pluggy

from kvtier.plugins.options import check_options
from kvtier.spec import (
    BytesLike,
    Capabilities,
    ContractError,
    Option,
    PluginError,
    ScanEntry,
    deprecated,
    hookspecs,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendHandle",
    "BackendInfo",
    "BackendRegistry",
    "default_registry",
]

ENTRY_POINT_GROUP = "kvtier.backends"
DISABLE_ENV = "KVTIER_DISABLE_PLUGINS"

#: Backends people look for that another distribution provides.
INSTALL_HINTS = {
    "object": "pip install 'kvtier[s3]'",
    "redis": "pip install kvtier-redis",
}

# the contract's hooks, and those that left it but are accepted for one release
_HOOK_NAMES = frozenset(
    n for spec in (hookspecs, deprecated) for n in dir(spec) if n.startswith("kvtier_")
)


@dataclass(frozen=True)
class BackendInfo:
    """Where a backend comes from."""

    name: str
    value: str  # "module:attr", or "<in-process>" for registered factories
    distribution: str | None
    version: str | None


class BackendHandle:
    """One validated backend instance behind typed methods.

    The only place that calls pluggy hooks.  :meth:`implements` tells which
    optional hooks the instance has.
    """

    def __init__(self, info: BackendInfo, instance: object) -> None:
        self.info = info
        self.instance = instance
        pm = pluggy.PluginManager("kvtier")
        pm.add_hookspecs(hookspecs)
        pm.add_hookspecs(deprecated)  # pluggy warns when a backend implements one
        label = _label(info)
        _check_names(instance, label)
        try:
            pm.register(instance, name=f"{info.name}@{id(instance):x}")
            pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(
                f"backend {label} does not match the kvtier contract: {exc}"
            ) from None
        self._pm = pm
        hook = pm.hook
        implemented = {name for name in _HOOK_NAMES if getattr(hook, name).get_hookimpls()}
        missing = [name for name in hookspecs.REQUIRED_HOOKS if name not in implemented]
        if missing:
            raise PluginError(
                f"backend {label} does not implement required hook(s): {', '.join(missing)}"
            )
        self._implemented = frozenset(implemented)
        self._hook = hook

    def implements(self, hook: str) -> bool:
        """Whether the instance implements ``hook`` (a name from :mod:`kvtier.spec.hookspecs`)."""
        if hook not in _HOOK_NAMES:
            raise ValueError(f"{hook!r} is not a kvtier hook")
        return hook in self._implemented

    # lifecycle ------------------------------------------------------------
    def options(self) -> Mapping[str, Option]:
        return self._hook.kvtier_options() or {}

    def open(self, options: Mapping[str, Any], namespace: str) -> None:
        """Open the instance with ``options`` checked against its ``kvtier_options``.

        Every open passes through here, so ``kvtier_open`` receives parsed
        values with defaults filled, whoever calls it; options the config
        loader checked already are not checked again.  Raises
        :class:`~kvtier.spec.ConfigError` naming the option.
        """
        checked = check_options(self.info.name, self.options(), options)
        self._hook.kvtier_open(options=checked, namespace=namespace)

    def capabilities(self) -> Capabilities:
        caps = self._hook.kvtier_capabilities()
        if caps is None:
            return Capabilities()
        if not isinstance(caps, Capabilities):
            raise PluginError(
                f"backend {_label(self.info)}: kvtier_capabilities returned "
                f"{type(caps).__name__}, expected kvtier.spec.Capabilities"
            )
        return caps

    def stats(self) -> Mapping[str, int | float]:
        return self._hook.kvtier_stats() or {}

    def close(self) -> None:
        self._hook.kvtier_close()

    # data path ------------------------------------------------------------
    def put(
        self,
        keys: Sequence[bytes],
        blocks: Sequence[BytesLike],
        evicted: MutableSequence[tuple[bytes, BytesLike]],
    ) -> Sequence[bool]:
        result: Sequence[bool] = self._hook.kvtier_put(keys=keys, blocks=blocks, evicted=evicted)
        return result

    def put_parts(
        self,
        keys: Sequence[bytes],
        parts: Sequence[Sequence[BytesLike]],
        evicted: MutableSequence[tuple[bytes, BytesLike]],
    ) -> Sequence[bool]:
        result: Sequence[bool] = self._hook.kvtier_put_parts(
            keys=keys, parts=parts, evicted=evicted
        )
        return result

    def get(self, keys: Sequence[bytes]) -> Sequence[BytesLike | None]:
        result: Sequence[BytesLike | None] = self._hook.kvtier_get(keys=keys)
        return result

    def get_into(
        self, keys: Sequence[bytes], buffers: Sequence[Sequence[memoryview]]
    ) -> Sequence[int | None]:
        result: Sequence[int | None] = self._hook.kvtier_get_into(keys=keys, buffers=buffers)
        return result

    def lookup(self, keys: Sequence[bytes]) -> Sequence[bool]:
        result: Sequence[bool] = self._hook.kvtier_lookup(keys=keys)
        return result

    def evict(self, keys: Sequence[bytes]) -> Sequence[bool]:
        result: Sequence[bool] = self._hook.kvtier_evict(keys=keys)
        return result

    def tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        """For tests only: the backend's raw access to its stored bytes.

        That is its ``kit_tamper`` method (:class:`kvtier.testing.RawAccess`,
        no hook), or for one release the deprecated hook ``kvtier_tamper``.
        The chain never calls it.
        """
        own = getattr(self.instance, "kit_tamper", None)
        if callable(own):
            return bool(own(key, transform))
        if not self.implements("kvtier_tamper"):
            raise PluginError(f"backend {_label(self.info)} gives no raw access (kit_tamper)")
        return bool(self._hook.kvtier_tamper(key=key, transform=transform))


    def scan(self, namespace: str | None) -> Iterator[list[ScanEntry]]:
        """Batches of what the store holds (``kvtier_scan``), checked for shape.

        Raises :class:`PluginError` if the backend does not implement the hook.
        """
        if not self.implements("kvtier_scan"):
            raise PluginError(
                f"backend {_label(self.info)} does not implement kvtier_scan (contract 1.1): "
                "it cannot list what it holds"
            )
        batches = self._hook.kvtier_scan(namespace=namespace)
        if batches is None:
            raise ContractError(f"backend {_label(self.info)}: kvtier_scan returned None")
        return _checked_scan(batches, _label(self.info))

    def keep(self, keys: Sequence[bytes], keep: bool) -> list[bool | None]:
        """Mark (``keep``) or release ``keys`` (``kvtier_keep``, contract 1.2); a backend
        without the hook keeps nothing: None (not held there) for every key."""
        if not keys or not self.implements("kvtier_keep"):
            return [None] * len(keys)
        result = self._hook.kvtier_keep(keys=keys, keep=keep)
        if result is None or len(result) != len(keys):
            raise ContractError(f"backend {_label(self.info)}: kvtier_keep answered "
                                f"{result!r} for {len(keys)} keys")
        return [None if r is None else bool(r) for r in result]

    def expire(self, keys: Sequence[bytes], after: float) -> list[bool | None]:
        """Give ``keys``' blocks a deadline ``after`` seconds from now (``kvtier_expire``,
        contract 1.3); a backend without the hook holds none: None for every key."""
        if not keys or not self.implements("kvtier_expire"):
            return [None] * len(keys)
        result = self._hook.kvtier_expire(keys=keys, after=after)
        if result is None or len(result) != len(keys):
            raise ContractError(f"backend {_label(self.info)}: kvtier_expire answered "
                                f"{result!r} for {len(keys)} keys")
        return [None if r is None else bool(r) for r in result]

    def deadlines(self, keys: Sequence[bytes]) -> list[float | None]:
        """Seconds left before ``keys``' deadlines (``kvtier_deadlines``, contract 1.4);
        None where there is none, and for every key of a backend without the hook."""
        if not keys or not self.implements("kvtier_deadlines"):
            return [None] * len(keys)
        result = self._hook.kvtier_deadlines(keys=keys)
        if result is None or len(result) != len(keys):
            raise ContractError(f"backend {_label(self.info)}: kvtier_deadlines answered "
                                f"{result!r} for {len(keys)} keys")
        return [_seconds_left(r, self.info) for r in result]


def _seconds_left(answer: object, info: Any) -> float | None:
    """A ``kvtier_deadlines`` answer checked: None, or seconds above 0."""
    if answer is None:
        return None
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not answer > 0 \
            or answer != answer or answer == float("inf"):
        raise ContractError(f"backend {_label(info)}: kvtier_deadlines answered {answer!r}: "
                            "seconds above 0, or None")
    return float(answer)


def _checked_scan(batches: object, label: str) -> Iterator[list[ScanEntry]]:
    try:
        iterator = iter(batches)  # type: ignore[call-overload]
    except TypeError:
        raise ContractError(f"backend {label}: kvtier_scan returned a "
                            f"{type(batches).__name__}, not an iterator of batches") from None
    for batch in iterator:
        out: list[ScanEntry] = []
        for item in batch:
            try:
                namespace, key, size, mtime = item
            except (TypeError, ValueError):
                raise ContractError(f"backend {label}: kvtier_scan entry {item!r} is not "
                                    "(namespace, key, size, mtime)") from None
            if (type(namespace) is not str or not isinstance(key, bytes)
                    or type(size) is not int or size < 0
                    or not (mtime is None or isinstance(mtime, int | float))):
                raise ContractError(f"backend {label}: kvtier_scan entry {item!r} has "
                                    "wrong types")
            out.append(ScanEntry(namespace, bytes(key), size,
                                 None if mtime is None else float(mtime)))
        if out:
            yield out


def _label(info: BackendInfo) -> str:
    if info.distribution:
        return f"{info.name!r} ({info.value}, from {info.distribution} {info.version})"
    return f"{info.name!r} ({info.value})"


def _check_names(instance: object, label: str) -> None:
    """Reject ``kvtier_*`` attributes that are not hooks, or hooks left undecorated.

    pluggy only sees methods marked ``@hookimpl``; a misspelt or unmarked
    hook would otherwise be silently ignored.
    """
    marker = "kvtier_impl"
    for attr in dir(type(instance)):
        if not attr.startswith("kvtier_"):
            continue
        value = getattr(instance, attr, None)
        if attr not in _HOOK_NAMES:
            close = difflib.get_close_matches(attr, sorted(_HOOK_NAMES), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise PluginError(f"backend {label}: {attr} is not a kvtier hook{hint}")
        if callable(value) and not hasattr(value, marker):
            raise PluginError(f"backend {label}: {attr} is not marked with @kvtier.spec.hookimpl")


class BackendRegistry:
    """Backends by name: entry points, plus factories registered in-process."""

    def __init__(self, group: str = ENTRY_POINT_GROUP) -> None:
        self._group = group
        self._lock = threading.Lock()
        self._entry_points: dict[str, importlib.metadata.EntryPoint] | None = None
        self._factories: dict[str, tuple[BackendInfo, Callable[[], object]]] = {}
        self._options_cache: dict[str, Mapping[str, Option]] = {}

    @staticmethod
    def disabled() -> frozenset[str]:
        raw = os.environ.get(DISABLE_ENV, "")
        return frozenset(name.strip() for name in raw.split(",") if name.strip())

    def _scan(self) -> dict[str, importlib.metadata.EntryPoint]:
        with self._lock:
            if self._entry_points is None:
                found: dict[str, importlib.metadata.EntryPoint] = {}
                for ep in importlib.metadata.entry_points(group=self._group):
                    # the first distribution on sys.path wins, as importlib does
                    found.setdefault(ep.name, ep)
                self._entry_points = found
            return self._entry_points

    def register(self, name: str, factory: Callable[[], object]) -> None:
        """Make ``factory`` available as backend ``name`` in this process.

        For tests and embedding; distributions use the entry-point group.
        """
        info = BackendInfo(
            name, f"<in-process {getattr(factory, '__qualname__', factory)!s}>", None, None
        )
        with self._lock:
            self._factories[name] = (info, factory)
            self._options_cache.pop(name, None)

    def names(self) -> list[str]:
        """Names of available backends, disabled ones left out."""
        names = set(self._scan()) | set(self._factories)
        return sorted(names - self.disabled())

    def info(self, name: str) -> BackendInfo:
        self._check_available(name)
        if name in self._factories:
            return self._factories[name][0]
        ep = self._scan()[name]
        dist = getattr(ep, "dist", None)
        return BackendInfo(
            name,
            ep.value,
            dist.metadata["Name"] if dist is not None else None,
            dist.version if dist is not None else None,
        )

    def _check_available(self, name: str) -> None:
        if name in self.disabled():
            raise PluginError(f"backend {name!r} is disabled by {DISABLE_ENV}")
        if name in self._factories or name in self._scan():
            return
        installed = ", ".join(self.names()) or "none"
        hint = INSTALL_HINTS.get(name)
        extra = f"; it is provided by another package: {hint}" if hint else ""
        raise PluginError(f"unknown backend {name!r} (installed: {installed}){extra}")

    def _factory(self, name: str) -> tuple[BackendInfo, Callable[[], object]]:
        self._check_available(name)
        if name in self._factories:
            return self._factories[name]
        info = self.info(name)
        ep = self._scan()[name]
        try:
            factory = ep.load()
        except ImportError as exc:
            hint = INSTALL_HINTS.get(name)
            extra = f"; install it with: {hint}" if hint else ""
            raise PluginError(
                f"backend {name!r} ({ep.value}) cannot be imported: {exc}{extra}"
            ) from exc
        except Exception as exc:
            raise PluginError(f"backend {name!r} ({ep.value}) failed to load: {exc!r}") from exc
        if not callable(factory):
            raise PluginError(f"backend {name!r}: entry point {ep.value} is not callable")
        return info, factory

    def create(self, name: str) -> BackendHandle:
        """A fresh, validated, not yet opened instance of backend ``name``."""
        info, factory = self._factory(name)
        try:
            instance = factory()
        except Exception as exc:
            raise PluginError(f"backend {_label(info)} could not be created: {exc!r}") from exc
        return BackendHandle(info, instance)

    def options(self, name: str) -> Mapping[str, Option]:
        """The options backend ``name`` declares (cached per name)."""
        cached = self._options_cache.get(name)
        if cached is None:
            cached = dict(self.create(name).options())
            self._options_cache[name] = cached
        return cached


_DEFAULT: BackendRegistry | None = None


def default_registry() -> BackendRegistry:
    """The process-wide registry of installed backends."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = BackendRegistry()
    return _DEFAULT
