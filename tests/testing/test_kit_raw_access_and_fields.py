"""What the kit reads moved out of the contract's way: raw access, eviction, capacity scope.

Raw access to the stored bytes is the kit's (``kit_tamper``, or ``tamper``
overridden in the test class), no longer the hook ``kvtier_tamper``; the
eviction and the capacity's scope are fields of ``Capabilities``, no longer
keys of ``extra``.  A backend on the old ways keeps passing the kit for a
release, warned each time what to write instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
from kit_third_party import NoRawAccess

from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import Capabilities
from kvtier.testing import BackendTests, RawAccess
from kvtier.testing.corruption import CorruptionTests
from kvtier.testing.groups import capacity_scope_of, eviction_of, missing_capability
from kvtier.testing.lifecycle import LifecycleTests
from kvtier.testing.raw import RAW_ACCESS, backend_tamper
from kvtier.testing.recency import RecencyTests
from kvtier.testing.shared import SharedTests


class TestThirdPartyBackend(BackendTests):
    """Every group on a backend of the public API alone: buffers helpers, kit_tamper, eviction."""

    backend = "kit_third_party:BufferDict"

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {"capacity": "2MiB"}

    def test_raw_access_and_recency_apply(self) -> None:
        instance = self.store.handle.instance
        assert isinstance(instance, RawAccess) and self.has_raw_access(instance)
        assert not self.store.handle.implements("kvtier_tamper")
        hooks = self.store.hooks | {RAW_ACCESS}
        for group in ("corruption", "recency", "capacity"):
            assert missing_capability(group, self.backend, self.caps, hooks) is None, group


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
class TestOldWays(CorruptionTests, RecencyTests, LifecycleTests):
    """The deprecated hook and ``extra`` still certify: corruption and recency run and pass."""

    backend = "kit_third_party:OldWays"

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {"capacity": "2MiB"}

    def test_the_old_ways_still_open_the_groups(self) -> None:
        hooks = self.store.hooks | {RAW_ACCESS}
        assert self.has_raw_access(self.store.handle.instance)
        for group in ("corruption", "recency"):
            assert missing_capability(group, self.backend, self.caps, hooks) is None, group

    def test_each_old_way_warns_naming_the_new(self) -> None:
        instance = self.store.handle.instance
        assert self.store.put([b"k"], [b"block"]) == [True]
        with pytest.warns(DeprecationWarning, match=r"kvtier_tamper is deprecated.*kit_tamper"):
            assert self.tamper(instance, b"k", lambda b: b[:2]) is True
        assert self.store.get([b"k"]) == [b"bl"]
        with pytest.warns(DeprecationWarning, match=r"declare Capabilities\(eviction=\.\.\.\)"):
            assert eviction_of(self.caps) == "lru"
        with pytest.warns(DeprecationWarning, match=r"Capabilities\(capacity_scope=\.\.\.\)"):
            assert capacity_scope_of(self.caps) == "namespace"
        registry = BackendRegistry()
        registry.register("old-ways", type(instance))
        with pytest.warns(DeprecationWarning, match="kit_tamper"):
            registry.create("old-ways")  # pluggy's warning, when the hook is registered


class TestTamperOverridden(CorruptionTests):
    """zarr's shape: the test class reaches the store itself, for a backend with no raw access."""

    backend = "kit_third_party:NoRawAccess"

    def tamper(self, instance: object, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        assert isinstance(instance, NoRawAccess)
        with instance.lock:
            if key not in instance.blocks:
                return False
            instance.blocks[key] = bytes(transform(instance.blocks[key]))
            return True

    def test_the_override_is_the_raw_access(self) -> None:
        instance = self.store.handle.instance
        assert backend_tamper(instance) is None  # the backend gives none
        assert self.has_raw_access(instance)


class TestNoRawAccess(CorruptionTests):
    backend = "kit_third_party:NoRawAccess"

    def test_the_group_says_what_is_missing(self) -> None:
        reason = missing_capability("corruption", self.backend, self.caps, self.store.hooks)
        assert reason is not None and "no kit_tamper method" in reason
        assert not self.has_raw_access(self.store.handle.instance)


def test_the_kit_reads_the_typed_fields() -> None:
    lru = Capabilities(capacity=100, eviction="lru")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fields are read without a word
        assert missing_capability("recency", "x", lru, ()) is None
        assert eviction_of(lru) == "lru" and capacity_scope_of(lru) == "namespace"
    shard = Capabilities(capacity=100, eviction="lru", capacity_scope="shard")
    assert missing_capability("recency", "x", shard, ()) == (
        "backend 'x' declares no capacity with eviction=lru over the namespace"
    )
    process = Capabilities(capacity=100, eviction="lru", capacity_scope="process")
    assert missing_capability("recency", "x", process, ()) is None
    assert missing_capability("recency", "x", Capabilities(eviction="lru"), ()) is not None
    assert missing_capability("recency", "x", Capabilities(capacity=100, eviction="arc"),
                              ()) is not None


def test_the_fields_win_over_extra() -> None:
    caps = Capabilities(capacity=100, eviction="arc", capacity_scope="pool",
                        extra={"eviction": "lru", "capacity_scope": "namespace"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert eviction_of(caps) == "arc" and capacity_scope_of(caps) == "pool"
    assert missing_capability("recency", "x", caps, ()) is not None


def test_extra_is_read_for_a_release_with_a_warning() -> None:
    old = Capabilities(capacity=100, extra={"eviction": "lru", "capacity_scope": "process"})
    with pytest.warns(DeprecationWarning) as record:
        assert missing_capability("recency", "x", old, ()) is None
    said = sorted(str(w.message) for w in record)
    assert said == [
        "Capabilities.extra['capacity_scope'] is deprecated and no longer read in the next "
        "release: declare Capabilities(capacity_scope=...), a field of its own",
        "Capabilities.extra['eviction'] is deprecated and no longer read in the next "
        "release: declare Capabilities(eviction=...), a field of its own",
    ]


class TestSharedReadsTheScope(SharedTests):
    """``capacity_scope="process"`` skips the shared capacity check, read from the field."""

    backend = "kit_third_party:ProcessScoped"

    def test_capacity_holds_for_all_instances_together(self) -> None:
        with pytest.raises(pytest.skip.Exception, match="capacity_scope=process"):
            super().test_capacity_holds_for_all_instances_together()

    def test_a_put_by_one_is_a_hit_for_the_other(self) -> None:
        pytest.skip("a process-memory dict is not one store for two instances")

    def test_an_evict_by_one_is_a_miss_for_the_other(self) -> None:
        pytest.skip("a process-memory dict is not one store for two instances")
