"""Group ``lifecycle``: options, capabilities, namespaces, and what close means."""

from __future__ import annotations

import secrets
import typing
from collections.abc import Callable, Mapping

import pytest

from kvtier.plugins.registry import BackendHandle
from kvtier.spec import Capabilities, ClosedError, Option, OptionType, PluginError

from .base import KitBase, kit_group
from .data import block_for, key_of, shown
from .raw import Tamperer, backend_tamper

__all__ = ["LifecycleTests"]

_KEY = b"kit/closed"
_OPTION_TYPES = frozenset(typing.get_args(OptionType))


def _view() -> list[memoryview]:
    return [memoryview(bytearray(4))]


def _own_tamper(handle: BackendHandle) -> Tamperer:
    tamper = backend_tamper(handle.instance)
    assert tamper is not None  # the test skips otherwise
    return tamper


#: Each hook called on a closed instance; ``kvtier_options`` is left out on
#: purpose: it is introspection that kvtier calls on instances that were never
#: opened, and answering it needs no open store.
AFTER_CLOSE: dict[str, Callable[[BackendHandle, KitBase], object]] = {
    "kvtier_open": lambda h, kit: h.open(kit.options, kit.namespace),
    "kvtier_capabilities": lambda h, kit: h.capabilities(),
    "kvtier_stats": lambda h, kit: h.stats(),
    "kvtier_put": lambda h, kit: h.put([_KEY], [b"x"], []),
    "kvtier_put_parts": lambda h, kit: h.put_parts([_KEY], [[b"x"]], []),
    "kvtier_get": lambda h, kit: h.get([_KEY]),
    "kvtier_get_into": lambda h, kit: h.get_into([_KEY], [_view()]),
    "kvtier_lookup": lambda h, kit: h.lookup([_KEY]),
    "kvtier_evict": lambda h, kit: h.evict([_KEY]),
    # the backend's own raw access for the kit (kvtier.testing.raw), though no hook
    "kit_tamper": lambda h, kit: _own_tamper(h)(_KEY, lambda b: b),
    # the call itself raises, not the first batch (spec: kvtier_scan)
    "kvtier_scan": lambda h, kit: h.scan(None),
    "kvtier_keep": lambda h, kit: h.keep([_KEY], True),
    "kvtier_expire": lambda h, kit: h.expire([_KEY], 1.0),
    "kvtier_deadlines": lambda h, kit: h.deadlines([_KEY]),
}


@kit_group("lifecycle")
class LifecycleTests(KitBase):
    """Runs for every backend."""

    def test_close_is_idempotent(self) -> None:
        handle = self.store.handle
        self.store.close()
        handle.close()  # a second close does nothing, and does not raise
        handle.close()

    @pytest.mark.parametrize("hook", list(AFTER_CLOSE))
    def test_hook_after_close_raises_closed_error(self, hook: str) -> None:
        handle = self.store.handle
        if hook == "kit_tamper" and backend_tamper(handle.instance) is None:
            pytest.skip(f"backend {self.backend!r} gives the kit no raw access of its own")
        elif hook != "kit_tamper" and hook not in self.store.hooks:
            pytest.skip(f"backend {self.backend!r} does not implement {hook}")
        key = key_of("closing", 0)
        flags = self.store.put([key], [block_for(key, 10)])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        self.store.close()
        with pytest.raises(ClosedError):
            AFTER_CLOSE[hook](handle, self)

    def test_options_are_option_values(self) -> None:
        declared = self.store.handle.options()
        assert isinstance(declared, Mapping), f"kvtier_options answered {type(declared).__name__}"
        for name, option in declared.items():
            assert isinstance(name, str), f"option name {name!r} is not a string"
            assert isinstance(option, Option), (
                f"option {name!r} is a {type(option).__name__}, not kvtier.spec.Option"
            )
            assert option.type in _OPTION_TYPES, f"option {name!r} has unknown type {option.type!r}"
            assert option.help, f"option {name!r} has no help text"
        # kvtier asks fresh, never opened instances (config validate, kvtier backends)
        fresh = self.new_backend().handle.options()
        assert set(fresh) == set(declared), "kvtier_options differs before and after open"

    def test_capabilities_is_a_capabilities(self) -> None:
        try:
            caps = self.store.handle.capabilities()
        except PluginError as exc:
            pytest.fail(str(exc))
        assert isinstance(caps, Capabilities), (
            f"kvtier_capabilities answered a {type(caps).__name__}, not kvtier.spec.Capabilities"
        )
        for name in ("capacity", "max_block_size"):
            value = getattr(caps, name)
            assert value is None or (type(value) is int and value > 0), (
                f"Capabilities.{name} must be a positive int or None, got {value!r}"
            )
        reported = self.store.stats().get("capacity_bytes")
        if reported is not None and caps.capacity is not None:
            assert reported == caps.capacity, (
                f"stats() capacity_bytes={reported} but Capabilities.capacity={caps.capacity}"
            )
        assert reported is None or caps.capacity is not None, (
            f"stats() reports capacity_bytes={reported} for a store declaring no capacity; "
            "an unbounded store leaves capacity_bytes out"
        )

    def test_capabilities_before_open(self) -> None:
        # kvtier backends lists what a backend can do from an instance never opened
        fresh = self.new_backend().handle
        try:
            caps = fresh.capabilities()
        except Exception as exc:
            raise AssertionError(
                f"kvtier_capabilities of an instance never opened raised {exc!r}; it answers "
                "for the default options, without I/O"
            ) from exc
        assert isinstance(caps, Capabilities), (
            f"kvtier_capabilities answered a {type(caps).__name__}, not kvtier.spec.Capabilities"
        )

    def test_namespaces_are_isolated(self) -> None:
        key = key_of("ns", 0)
        mine = block_for(key, 500)
        flags = self.store.put([key], [mine])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        other = self.open_backend(secrets.token_hex(16))
        assert other.lookup([key]) == [False], "a key of another namespace is visible"
        assert other.get([key]) == [None], "a block of another namespace was served"
        theirs = block_for(key + b"/other", 700)
        flags = other.put([key], [theirs])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        got = other.get([key])
        assert got == [theirs], (
            f"get returned {shown(got)} where [theirs] was expected: "
            "a block reads back exactly as stored, and a key not stored is a miss"
        )
        assert self.store.get([key]) == [mine], "another namespace's put replaced this block"
        flags = other.evict([key])
        assert flags == [True], (
            f"evict answered {flags} where [True] was expected: "
            "evict answers True exactly where it removed a stored block"
        )
        assert self.store.get([key]) == [mine], "another namespace's evict removed this block"

    def test_close_then_open_a_new_instance(self) -> None:
        key = key_of("reuse", 0)
        flags = self.store.put([key], [block_for(key, 64)])
        assert flags == [True], (
            f"put answered {flags} where [True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        # a closed instance must release what it holds (locks, handles)
        fresh = self.reopen()
        other = key_of("reuse", 1)
        assert fresh.put([other], [block_for(other, 64)]) == [True], (
            "a put into an instance opened after another was closed was refused"
        )
        assert fresh.get([other]) == [block_for(other, 64)], (
            "an instance opened after another was closed lost a block it had just stored"
        )
