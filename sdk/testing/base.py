"""The machinery under every group of the kit: find, open, drive and close a backend.

:class:`KitBase` is what :class:`~kvtier.testing.BackendTests` builds on.  It
resolves the class attribute ``backend`` (an entry-point name, or an import
path ``package.module:Factory``), validates the options from the
``backend_options`` fixture the way a chain would, and opens a fresh instance
in a fresh namespace for every test.  Tests talk to instances through
:class:`KitBackend`, which checks the shape of every answer against the
contract before the test looks at its content.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import pytest

from kvtier import Chain, Namespace, open_chain
from kvtier.plugins.registry import BackendHandle
from kvtier.spec import BytesLike, Capabilities, PluginError, ScanEntry, hookspecs

from .footprint import Footprint
from .groups import GROUPS, missing_capability
from .raw import RAW_ACCESS, backend_tamper
from .resolve import resolve_backend, validate_options

__all__ = ["KitBackend", "KitBase", "hook_names", "kit_group"]

C = TypeVar("C", bound=type)

#: The marker every test of the kit carries; the plugin registers it.
MARKER = "kvtier_group"


def kit_group(name: str) -> Callable[[C], C]:
    """Class decorator: every ``test_*`` method defined in the class belongs to group ``name``.

    The mark goes on the methods, not the class: the groups are mixins of one
    class, and a class-level ``pytestmark`` would be inherited by all of them.
    """
    if name not in GROUPS:
        raise ValueError(f"unknown kit group {name!r}; known: {', '.join(GROUPS)}")
    mark = getattr(pytest.mark, MARKER)(name)

    def decorate(cls: C) -> C:
        for attr, value in list(vars(cls).items()):
            if attr.startswith("test_") and callable(value):
                setattr(cls, attr, mark(value))
        return cls

    return decorate


def hook_names(handle: BackendHandle) -> frozenset[str]:
    """The hooks ``handle``'s instance implements, as the registry validated them."""
    return frozenset(
        name for name in dir(hookspecs) if name.startswith("kvtier_") and handle.implements(name)
    )


def _as_bytes(value: object, what: str) -> bytes:
    try:
        with memoryview(value) as view:  # type: ignore[arg-type]
            return view.tobytes()
    except TypeError:
        raise AssertionError(f"{what} is a {type(value).__name__}, not bytes-like") from None


class KitBackend:
    """An open backend instance whose answers are checked for shape.

    Every method calls one hook through the :class:`~kvtier.plugins.registry.BackendHandle`
    and fails the test (``AssertionError``) if the answer is not a sequence of
    the batch's length with items of the contract's types.  Blocks come back
    as ``bytes`` copies, so a test can compare and keep them freely.
    """

    def __init__(self, handle: BackendHandle, label: str, namespace: str) -> None:
        self.handle = handle
        self.label = label
        self.namespace = namespace
        self.caps = Capabilities()
        self.closed = False
        self.hooks = hook_names(handle)
        #: Keys this instance's puts answered True for, so teardown can remove them.
        self.footprint: Footprint | None = None

    def implements(self, hook: str) -> bool:
        """Whether the backend implements optional ``hook`` (``"kvtier_get_into"``)."""
        return hook in self.hooks

    def _stored(self, keys: Sequence[bytes], flags: Sequence[bool]) -> None:
        if self.footprint is not None:
            self.footprint.add(self.namespace, (k for k, f in zip(keys, flags) if f))

    def _answer(self, hook: str, answer: object, n: int) -> list[Any]:
        if not isinstance(answer, Sequence) or isinstance(answer, (str, bytes, bytearray)):
            raise AssertionError(
                f"{self.label}: {hook} answered a {type(answer).__name__}, expected a sequence"
            )
        if len(answer) != n:
            raise AssertionError(
                f"{self.label}: {hook} answered {len(answer)} items for a batch of {n} keys"
            )
        return list(answer)

    def _flags(self, hook: str, answer: object, n: int) -> list[bool]:
        flags = self._answer(hook, answer, n)
        for flag in flags:
            if not isinstance(flag, bool):
                raise AssertionError(f"{self.label}: {hook} answered {flag!r}, expected a bool")
        return flags

    def _evicted(
        self, raw: list[tuple[bytes, BytesLike]], out: list[tuple[bytes, bytes]] | None
    ) -> None:
        for item in raw:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], bytes)):
                raise AssertionError(
                    f"{self.label}: kvtier_put reported {item!r} as evicted, "
                    "expected a (key, block) tuple"
                )
            if out is not None:
                out.append((item[0], _as_bytes(item[1], "an evicted block")))

    def put(
        self,
        keys: Sequence[bytes],
        blocks: Sequence[BytesLike],
        evicted: list[tuple[bytes, bytes]] | None = None,
    ) -> list[bool]:
        """``kvtier_put``; reported evictions are appended to ``evicted`` as bytes."""
        raw: list[tuple[bytes, BytesLike]] = []
        flags = self._flags("kvtier_put", self.handle.put(keys, blocks, raw), len(keys))
        self._evicted(raw, evicted)
        self._stored(keys, flags)
        return flags

    def put_parts(
        self,
        keys: Sequence[bytes],
        parts: Sequence[Sequence[BytesLike]],
        evicted: list[tuple[bytes, bytes]] | None = None,
    ) -> list[bool]:
        """``kvtier_put_parts`` (the test must check ``implements("kvtier_put_parts")`` first)."""
        raw: list[tuple[bytes, BytesLike]] = []
        answer = self.handle.put_parts(keys, parts, raw)
        flags = self._flags("kvtier_put_parts", answer, len(keys))
        self._evicted(raw, evicted)
        self._stored(keys, flags)
        return flags

    def get_raw(self, keys: Sequence[bytes]) -> list[BytesLike | None]:
        """``kvtier_get`` exactly as answered (to check the objects are never changed later)."""
        return self._answer("kvtier_get", self.handle.get(keys), len(keys))

    def get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """``kvtier_get``, each hit copied to ``bytes``."""
        return [
            None if item is None else _as_bytes(item, "a block from kvtier_get")
            for item in self.get_raw(keys)
        ]

    def get_into(
        self, keys: Sequence[bytes], buffers: Sequence[Sequence[memoryview]]
    ) -> list[int | None]:
        """``kvtier_get_into`` (the test must check ``implements("kvtier_get_into")`` first)."""
        sizes = self._answer("kvtier_get_into", self.handle.get_into(keys, buffers), len(keys))
        for size in sizes:
            if size is not None and (isinstance(size, bool) or not isinstance(size, int)):
                raise AssertionError(
                    f"{self.label}: kvtier_get_into answered {size!r}, expected a size or None"
                )
        return sizes

    def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        return self._flags("kvtier_lookup", self.handle.lookup(keys), len(keys))

    def evict(self, keys: Sequence[bytes]) -> list[bool]:
        return self._flags("kvtier_evict", self.handle.evict(keys), len(keys))

    def stats(self) -> dict[str, int | float]:
        stats = dict(self.handle.stats())
        for name, value in stats.items():
            if not isinstance(name, str) or isinstance(value, bool):
                raise AssertionError(f"{self.label}: kvtier_stats gave {name!r}: {value!r}")
            if not isinstance(value, (int, float)):
                raise AssertionError(f"{self.label}: kvtier_stats gave {name!r}: {value!r}")
        return stats

    def scan(self, namespace: str | None) -> list[ScanEntry]:
        """``kvtier_scan`` read to the end (the test must check ``implements`` first).

        The registry checks each entry's shape; a batch must hold at least one.
        """
        entries: list[ScanEntry] = []
        for batch in self.handle.scan(namespace):
            if not batch:
                raise AssertionError(f"{self.label}: kvtier_scan gave an empty batch")
            entries.extend(batch)
        return entries

    def tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        """The backend's own raw access (:mod:`kvtier.testing.raw`).

        The kit's groups call ``KitBase.tamper``, which a test class may override.
        """
        tamper = backend_tamper(self.handle.instance)
        if tamper is None:
            raise PluginError(f"backend {self.label!r} gives the kit no raw access (kit_tamper)")
        return tamper(key, transform)

    def close(self) -> None:
        """Close the instance (once: a second call is the lifecycle group's business)."""
        if not self.closed:
            self.closed = True
            self.handle.close()


class KitBase:
    """Fixtures and helpers shared by every group of :class:`~kvtier.testing.BackendTests`.

    Subclasses set ``backend`` and may override ``backend_options``.  During a
    test these attributes are set:

    ``store``
        the :class:`KitBackend` opened for this test (fresh namespace);
        :meth:`reopen` replaces it.
    ``caps``
        its :class:`~kvtier.spec.Capabilities`.
    ``namespace``
        the test's namespace, 32 hex digits.
    ``options``
        the validated options passed to ``kvtier_open``.
    ``raw_options``
        the options as ``backend_options`` gave them.
    ``rng``
        a :class:`random.Random` seeded from the test's name, so a failure
        repeats on the next run.
    """

    #: An entry-point name (``"host"``) or an import path (``"pkg.module:Factory"``).
    backend: ClassVar[str] = ""
    #: Hypothesis budget of the stateful group: examples, and steps per example.
    stateful_max_examples: ClassVar[int] = 50
    stateful_step_count: ClassVar[int] = 30
    #: Hypothesis explores the same sequences on every run unless set False.
    stateful_derandomize: ClassVar[bool] = True
    #: Set False for a backend whose ``kvtier_lookup`` may answer from a short-lived
    #: cache (the contract allows a stale True); the kit then checks lookup only
    #: where it answers False.
    lookup_exact: ClassVar[bool] = True

    store: KitBackend
    caps: Capabilities
    namespace: str
    options: Mapping[str, Any]
    raw_options: dict[str, Any]
    rng: random.Random
    _opened: list[KitBackend]
    _chains: list[Chain]
    _footprint: Footprint

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        """The backend's options for one test; override it (it may use ``tmp_path``)."""
        return {}

    @pytest.fixture(autouse=True)
    def _kvtier_kit(self, request: pytest.FixtureRequest) -> Iterator[None]:
        marker = request.node.get_closest_marker(MARKER)
        group = str(marker.args[0]) if marker is not None and marker.args else ""
        if not self.backend:
            raise PluginError(
                f"{type(self).__name__} must set the class attribute backend to a backend "
                "name or an import path such as 'my_pkg.backend:MyBackend'"
            )
        self.raw_options = self._kvtier_raw_options(request)
        self.options = validate_options(self.backend, self.raw_options)
        self.namespace = secrets.token_hex(16)
        name = request.node.nodeid.encode()
        self.rng = random.Random(hashlib.blake2b(name, digest_size=8).digest())
        self._opened = []
        self._chains = []
        self._footprint = Footprint()
        try:
            self.store = self.open_backend()
            self.caps = self.store.caps
            hooks = self.store.hooks
            if self.has_raw_access(self.store.handle.instance):
                hooks |= {RAW_ACCESS}
            reason = missing_capability(group, self.backend, self.caps, hooks)
        except BaseException:
            self._close_all()
            raise
        if reason is not None:
            self._close_all()
            pytest.skip(reason)
        try:
            yield
        finally:
            try:
                self._close_all()
            finally:
                self._remove_footprint()

    @pytest.fixture(name="store")
    def _kvtier_store(self, _kvtier_kit: None) -> KitBackend:
        """The instance opened for this test, as a fixture: ``def test_x(self, store)``.

        The same object as ``self.store`` when the test starts; after
        :meth:`reopen` use what it returns.
        """
        return self.store

    def _kvtier_raw_options(self, request: pytest.FixtureRequest) -> dict[str, Any]:
        try:
            given: Any = request.getfixturevalue("backend_options")
        except pytest.FixtureLookupError:
            # backend_options overridden without @pytest.fixture: a method or a dict
            given = type(self).backend_options
            given = given(self) if callable(given) else given
        if not isinstance(given, Mapping):
            raise TypeError(f"backend_options must give a dict of options, got {given!r}")
        return dict(given)

    def _close_all(self) -> None:
        errors: list[BaseException] = []
        for chain in self._chains:
            try:
                chain.close()
            except Exception as exc:
                errors.append(exc)
        for kit in self._opened:
            try:
                kit.close()
            except Exception as exc:
                errors.append(exc)
        self._chains, self._opened = [], []
        if errors:
            raise errors[0]

    def _remove_footprint(self) -> None:
        """Evict every key the test stored, in every namespace it used.

        Best effort: the test's verdict is about what it checked, and a
        backend that cannot evict fails the groups that say so.
        """
        for namespace, keys in self._footprint.take().items():
            try:
                kit = self.new_backend()
                kit.namespace = namespace
                kit.handle.open(self.options, namespace)
                for start in range(0, len(keys), 256):
                    kit.handle.evict(keys[start : start + 256])
            except Exception:  # cleanup must not mask the test's outcome
                continue
            finally:
                with contextlib.suppress(Exception):
                    self._close_all()

    def remember_stored(self, namespace: str, keys: Sequence[bytes]) -> None:
        """Record keys stored behind the kit's back (a chain, a child process) for teardown."""
        self._footprint.add(namespace, keys)

    # raw access, for the corruption group ---------------------------------------
    def tamper(self, instance: object, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        """Replace the stored bytes ``b`` of ``key`` by ``transform(b)``, behind the backend's back.

        ``instance`` is the backend object (``store.handle.instance``, or a
        chain's tier's ``handle.instance``), open in this test's namespace.
        Answer ``True`` if the key was stored and has been rewritten,
        ``False`` if it was not stored.  Override it where the backend gives
        no raw access of its own, reaching the store itself as zarr's
        ``StoreTests.set`` does (the files under ``self.options``, a client
        of the server): what ``kvtier_get`` serves next must be the damaged
        bytes.  The default asks the backend (:mod:`kvtier.testing.raw`).
        """
        tamper = backend_tamper(instance)
        if tamper is None:
            raise NotImplementedError(
                f"backend {self.backend!r} gives the kit no raw access: write kit_tamper "
                f"(kvtier.testing.RawAccess) or override {type(self).__name__}.tamper"
            )
        return tamper(key, transform)

    def has_raw_access(self, instance: object) -> bool:
        """Whether :meth:`tamper` reaches ``instance``'s stored bytes (overridden, or its own)."""
        return type(self).tamper is not KitBase.tamper or backend_tamper(instance) is not None

    # helpers for groups and for authors' own tests ------------------------------
    def new_backend(self) -> KitBackend:
        """A fresh, validated instance that is not opened yet (closed at teardown)."""
        registry, name = resolve_backend(self.backend)
        kit = KitBackend(registry.create(name), self.backend, "")
        kit.footprint = self._footprint
        self._opened.append(kit)
        return kit

    def open_backend(self, namespace: str | None = None) -> KitBackend:
        """A fresh instance opened with the test's options (closed at teardown).

        ``namespace`` defaults to the test's own; pass another 32-hex-digit
        string for an instance that must not see this test's blocks.
        """
        kit = self.new_backend()
        kit.namespace = self.namespace if namespace is None else namespace
        kit.handle.open(self.options, kit.namespace)
        kit.caps = kit.handle.capabilities()
        return kit

    def reopen(self) -> KitBackend:
        """Close ``self.store`` and open a fresh instance with the same options and namespace."""
        self.store.close()
        self.store = self.open_backend()
        return self.store

    def open_chain(self) -> Chain:
        """A one-tier chain over this backend, in the test's namespace (closed at teardown)."""
        registry, name = resolve_backend(self.backend)
        # required: a backend that cannot open fails here, not as misses later
        config = {"chain": [{"name": "kit", "backend": name, "required": True,
                             **self.raw_options}]}
        chain = open_chain(config, namespace=Namespace.from_hex(self.namespace), registry=registry)
        self._chains.append(chain)
        return chain

    def block_limit(self) -> int | None:
        """Largest block the backend declares it takes (capacity, max_block_size), or None."""
        limits = [x for x in (self.caps.capacity, self.caps.max_block_size) if x is not None]
        return min(limits) if limits else None
