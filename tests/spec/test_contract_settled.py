"""The contract without the kit's needs: no raw-access hook, eviction and scope as fields.

``kvtier_tamper`` left :mod:`kvtier.spec.hookspecs` for the kit
(:class:`kvtier.testing.RawAccess`); :mod:`kvtier.spec.deprecated` keeps it
accepted for one release, and says where it went.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from kvtier.plugins.registry import BackendHandle, BackendInfo
from kvtier.spec import Capabilities, deprecated, hookimpl, hookspecs
from kvtier.spec.base import Tamper  # the old import path, kept for a release


class HandWritten:
    """The four required hooks by hand, and the deprecated raw-access hook."""

    def __init__(self) -> None:
        self.blocks: dict[bytes, bytes] = {}

    @hookimpl
    def kvtier_put(self, keys: Sequence[bytes], blocks: Sequence[bytes],
                   evicted: list[tuple[bytes, bytes]]) -> list[bool]:
        for key, block in zip(keys, blocks):
            self.blocks.setdefault(key, bytes(block))
        return [True] * len(keys)

    @hookimpl
    def kvtier_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return [self.blocks.get(key) for key in keys]

    @hookimpl
    def kvtier_lookup(self, keys: Sequence[bytes]) -> list[bool]:
        return [key in self.blocks for key in keys]

    @hookimpl
    def kvtier_evict(self, keys: Sequence[bytes]) -> list[bool]:
        return [self.blocks.pop(key, None) is not None for key in keys]

    @hookimpl
    def kvtier_tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        if key not in self.blocks:
            return False
        self.blocks[key] = transform(self.blocks[key])
        return True


def handle_of(instance: object) -> BackendHandle:
    return BackendHandle(BackendInfo("t", "<in-process>", None, None), instance)


def test_the_contract_has_no_raw_access_hook() -> None:
    names = {n for n in dir(hookspecs) if n.startswith("kvtier_")}
    assert "kvtier_tamper" not in names
    assert {n for n in dir(deprecated) if n.startswith("kvtier_")} == {"kvtier_tamper"}
    warning = deprecated.kvtier_tamper.kvtier_spec["warn_on_impl"]
    assert isinstance(warning, DeprecationWarning) and "kit_tamper" in str(warning)


def test_a_backend_with_the_deprecated_hook_still_registers_and_warns() -> None:
    with pytest.warns(DeprecationWarning, match=r"kvtier_tamper is deprecated.*kit_tamper"):
        handle = handle_of(HandWritten())
    assert handle.implements("kvtier_tamper")
    assert handle.put([b"k"], [b"abcdef"], []) == [True]
    assert handle.tamper(b"k", lambda b: b[:3]) is True
    assert handle.get([b"k"]) == [b"abc"]
    assert handle.tamper(b"absent", lambda b: b) is False


def test_the_deprecated_mixin_is_importable_for_a_release() -> None:
    assert Tamper is deprecated.Tamper
    assert callable(Tamper.kvtier_tamper)


def test_eviction_and_capacity_scope_are_fields() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(Capabilities)}
    assert fields["eviction"] is None
    assert fields["capacity_scope"] == "namespace"
    caps = Capabilities(capacity=10, eviction="lru", capacity_scope="shard")
    assert (caps.eviction, caps.capacity_scope, caps.extra) == ("lru", "shard", {})
