"""The ``host`` backend's registration, options and capabilities, tamper, and open/close."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from host_blocks import NS, POLICIES, block, open_host

from kvtier.plugins.registry import BackendHandle, default_registry
from kvtier.spec import ClosedError, ConfigError, KvtierError

# --- registration, options, capabilities --------------------------------------


def test_entry_point_options_and_hooks() -> None:
    handle = default_registry().create("host")
    assert handle.info.value == "kvtier.backends.host:HostBackend"
    optional = ("kvtier_put_parts", "kvtier_get_into", "kvtier_scan")
    assert all(handle.implements(hook) for hook in optional)
    assert callable(handle.instance.kit_tamper)  # the kit's raw access, no hook
    opts = handle.options()
    assert set(opts) == {"capacity", "eviction", "max_block_size", "prefault", "sizing_sample",
                         "tenants", "tenant", "expire", "share"}
    assert opts["sizing_sample"].type == "float" and opts["sizing_sample"].default == 0.01
    assert opts["prefault"].type == "size" and opts["prefault"].default == "128MiB"
    assert opts["capacity"].type == "size" and opts["capacity"].required
    assert opts["capacity"].help
    assert opts["eviction"].type == "str"
    assert opts["eviction"].choices == ("lru", "arc", "s3fifo", "adaptive")
    assert opts["eviction"].default == "lru"
    assert opts["max_block_size"].type == "size" and opts["max_block_size"].default is None


@pytest.mark.parametrize("eviction", POLICIES)
def test_capabilities_and_initial_stats(eviction: str) -> None:
    handle = open_host(1000, eviction, max_block_size=300)
    caps = handle.capabilities()
    assert (caps.persistent, caps.shared, caps.thread_safe) == (False, False, True)
    assert caps.capacity == 1000 and caps.max_block_size == 300
    assert caps.reports_evictions and caps.eviction == eviction and caps.extra == {}
    stats = dict(handle.stats())
    expected = {"used_bytes": 0, "blocks": 0, "capacity_bytes": 1000, "evictions": 0,
                "expired": 0, "kept_bytes": 0, "kept_blocks": 0, "keep_refused": 0,
                **{f"tenant_{n}.default": 0
                                 for n in ("bytes", "refused", "evicted", "expired")}}
    if eviction == "arc":
        expected["arc_p"] = 0
    if eviction == "s3fifo":
        expected["s3fifo_small_bytes"] = 0
    if eviction == "adaptive":
        expected.update({"adaptive_leader": 2, "adaptive_switches": 0})  # s3fifo first
    expected.update({f"sizing_hit_ratio_{m}x": 0.0 for m in ("0.5", "1", "2", "4")})
    expected.update({"sizing_gets": 0, "sizing_sample": 0.01})
    assert stats == expected
    handle.close()


def test_size_strings_accepted_when_opened_directly() -> None:
    handle = open_host("1KiB", max_block_size="100")
    caps = handle.capabilities()
    assert caps.capacity == 1024 and caps.max_block_size == 100
    assert open_host(1000).capabilities().max_block_size is None


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({}, "capacity"),
        ({"capacity": None}, "capacity"),
        ({"capacity": 0}, "capacity"),
        ({"capacity": -5}, "capacity"),
        ({"capacity": True}, "capacity"),
        ({"capacity": 1.5}, "capacity"),
        ({"capacity": "lots"}, "capacity"),
        ({"capacity": 100, "eviction": "fifo"}, "eviction"),
        ({"capacity": 100, "eviction": 3}, "eviction"),
        ({"capacity": 100, "max_block_size": 0}, "max_block_size"),
        ({"capacity": 100, "max_block_size": "big"}, "max_block_size"),
        ({"capacity": 100, "colour": "blue"}, "colour"),
    ],
)
def test_bad_options_raise_config_error_naming_the_key(
    options: dict[str, object], key: str
) -> None:
    handle = default_registry().create("host")
    with pytest.raises(ConfigError) as info:
        handle.open(options, NS)
    assert info.value.key == key
    assert key in str(info.value)


# --- tamper and lifecycle ---------------------------------------------------------------


def test_tamper_rewrites_raw_bytes(host: BackendHandle) -> None:
    data = block(b"t", 100)
    host.put([b"t"], [data], [])
    assert host.tamper(b"t", lambda b: bytes([b[0] ^ 1]) + b[1:])
    assert host.get([b"t"])[0] == bytes([data[0] ^ 1]) + data[1:]
    assert host.tamper(b"t", lambda b: b[:60])  # a truncating crash
    assert list(host.get_into([b"t"], [[memoryview(bytearray(100))]])) == [60]
    assert host.stats()["used_bytes"] == 60
    assert not host.tamper(b"absent", lambda b: b)


@pytest.mark.parametrize("eviction", POLICIES)
def test_tamper_that_grows_a_block_keeps_capacity(eviction: str) -> None:
    handle = open_host(300, eviction)
    handle.put([b"a", b"b", b"c"], [b"a" * 100, b"b" * 100, b"c" * 100], [])
    assert handle.tamper(b"c", lambda b: b + b"!" * 50)
    stats = handle.stats()
    assert stats["used_bytes"] <= 300 and stats["blocks"] == 2
    assert handle.get([b"a", b"c"]) == [None, b"c" * 100 + b"!" * 50]


def test_close_is_idempotent_and_later_use_raises() -> None:
    handle = open_host(1000)
    handle.put([b"a"], [b"x"], [])
    handle.close()
    handle.close()
    calls: list[Callable[[], object]] = [
        lambda: handle.put([b"a"], [b"x"], []),
        lambda: handle.put_parts([b"a"], [[b"x"]], []),
        lambda: handle.get([b"a"]),
        lambda: handle.get_into([b"a"], [[memoryview(bytearray(1))]]),
        lambda: handle.lookup([b"a"]),
        lambda: handle.evict([b"a"]),
        lambda: handle.tamper(b"a", lambda b: b),
        lambda: handle.stats(),
        lambda: handle.capabilities(),
        lambda: handle.open({"capacity": 10}, NS),
    ]
    for call in calls:
        with pytest.raises(ClosedError):
            call()
    with pytest.raises(ClosedError):
        handle.put([], [], [])  # even an empty batch
    assert "capacity" in handle.options()  # introspection only, still answers


def test_capabilities_before_open_describe_the_backend() -> None:
    caps = default_registry().create("host").capabilities()
    assert caps.reports_evictions and caps.thread_safe and not caps.persistent
    assert caps.capacity is None


def test_use_before_open_and_double_open() -> None:
    handle = default_registry().create("host")
    with pytest.raises(ClosedError, match="not open"):
        handle.get([b"a"])
    handle.open({"capacity": 10}, NS)
    with pytest.raises(KvtierError, match="already open"):
        handle.open({"capacity": 10}, NS)
    handle.close()


@pytest.mark.parametrize("prefault", [0, "0", "1MiB", "1GiB"])
def test_prefault_sizes_are_accepted_and_change_no_data(prefault: object) -> None:
    handle = open_host("8MiB", prefault=prefault)  # capped at the capacity
    try:
        assert handle.put([b"a"], [b"x" * 1000], []) == [True]
        assert [bytes(b) for b in handle.get([b"a"])] == [b"x" * 1000]
    finally:
        handle.close()


def test_prefault_that_is_not_a_size_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        open_host("8MiB", prefault="lots")
    assert info.value.key == "prefault"
