"""kvtier.spec.BlockStore: the contract's shared rules, implemented once."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from kvtier.plugins.registry import BackendHandle, BackendInfo
from kvtier.spec import (
    BlockStore,
    BytesLike,
    Capabilities,
    ClosedError,
    Evicted,
    Failed,
    GetInto,
    KvtierError,
    Option,
    check_batch,
    first_positions,
    map_batch,
    run_batch,
)


class Recording(BlockStore):
    """A dict store that records what reached it."""

    name = "recording"
    OPTIONS = {"limit": Option("int", "blocks held at most", 100)}

    def __init__(self) -> None:
        super().__init__()
        self.blocks: dict[bytes, bytes] = {}
        self.calls: list[tuple[str, list[bytes]]] = []
        self.opened_with: Mapping[str, Any] = {}
        self.closes = 0

    def _open(self, options: Mapping[str, Any], namespace: str) -> None:
        self.opened_with = options

    def _close(self) -> None:
        self.closes += 1

    def _capabilities(self) -> Capabilities:
        return Capabilities(capacity=None if not self.is_open else 4096)

    def _put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> list[bool]:
        self.calls.append(("put", list(keys)))
        for key, block in zip(keys, blocks, strict=True):
            self.blocks.setdefault(key, bytes(block))
        return [True] * len(keys)

    def _get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        self.calls.append(("get", list(keys)))
        return [self.blocks.get(key) for key in keys]

    def _lookup(self, keys: Sequence[bytes]) -> list[bool]:
        self.calls.append(("lookup", list(keys)))
        return [key in self.blocks for key in keys]

    def _evict(self, keys: Sequence[bytes]) -> list[bool]:
        self.calls.append(("evict", list(keys)))
        return [self.blocks.pop(key, None) is not None for key in keys]


class WithGetInto(Recording, GetInto):
    def _get_into(
        self, keys: Sequence[bytes], buffers: Sequence[Sequence[memoryview]]
    ) -> list[int | None]:
        return [None for _ in keys]


def handle_of(store: object) -> BackendHandle:
    return BackendHandle(BackendInfo("recording", "<in-process>", None, None), store)


def test_lifecycle_new_open_closed() -> None:
    store = Recording()
    handle = handle_of(store)
    assert set(handle.options()) == {"limit"}
    assert handle.capabilities().capacity is None  # answered before open
    with pytest.raises(ClosedError, match="recording backend is not open"):
        handle.get([b"k"])
    handle.open({"limit": 3}, "ns")
    assert store.opened_with == {"limit": 3} and store.namespace == "ns"
    assert handle.capabilities().capacity == 4096
    with pytest.raises(KvtierError, match="already open"):
        store.kvtier_open({"limit": 3}, "ns")
    handle.close()
    handle.close()  # idempotent: _close ran once
    assert store.closes == 1
    for call in (
        lambda: handle.put([b"k"], [b"v"], []),
        lambda: handle.get([b"k"]),
        lambda: handle.lookup([b"k"]),
        lambda: handle.evict([b"k"]),
        lambda: handle.stats(),
        lambda: handle.capabilities(),
    ):
        with pytest.raises(ClosedError, match="recording backend is closed"):
            call()
    with pytest.raises(ClosedError):
        store.kvtier_open({"limit": 3}, "ns")  # a closed instance never reopens
    assert set(handle.options()) == {"limit"}  # pure introspection still answers


def test_a_close_before_open_skips_the_subclass() -> None:
    store = Recording()
    store.kvtier_close()
    assert store.closes == 0
    with pytest.raises(ClosedError, match="closed"):
        store.kvtier_capabilities()


def test_empty_batches_never_reach_the_backend() -> None:
    store = Recording()
    store.kvtier_open({}, "ns")
    assert list(store.kvtier_put([], [], [])) == []
    assert list(store.kvtier_get([])) == []
    assert list(store.kvtier_lookup([])) == []
    assert list(store.kvtier_evict([])) == []
    assert store.calls == []


def test_batch_lengths_are_checked() -> None:
    store = WithGetInto()
    store.kvtier_open({}, "ns")
    with pytest.raises(ValueError, match="batch of 2 keys but 1 blocks"):
        store.kvtier_put([b"a", b"b"], [b"1"], [])
    with pytest.raises(ValueError, match="batch of 1 keys but 2 scatter lists"):
        store.kvtier_get_into([b"a"], [[], []])
    assert store.calls == []


def test_a_repeated_key_stores_its_first_occurrence() -> None:
    store = Recording()
    store.kvtier_open({}, "ns")
    answers = store.kvtier_put([b"a", b"b", b"a", b"a"], [b"first", b"b", b"second", b"third"], [])
    assert list(answers) == [True, True, True, True]
    assert store.calls == [("put", [b"a", b"b"])]  # each key reached the backend once
    assert store.blocks == {b"a": b"first", b"b": b"b"}


def test_a_repeated_key_answers_what_its_first_occurrence_did() -> None:
    class RefusesB(Recording):
        def _put(
            self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
        ) -> list[bool]:
            return [key != b"b" for key in keys]

    store = RefusesB()
    store.kvtier_open({}, "ns")
    assert list(store.kvtier_put([b"b", b"a", b"b"], [b"1", b"2", b"3"], [])) == [
        False, True, False,
    ]


def test_optional_hooks_are_opt_in() -> None:
    plain, fast = handle_of(Recording()), handle_of(WithGetInto())
    assert not plain.implements("kvtier_get_into")
    assert not plain.implements("kvtier_put_parts")
    assert not plain.implements("kvtier_scan")
    assert not plain.implements("kvtier_tamper")
    assert fast.implements("kvtier_get_into")
    assert not fast.implements("kvtier_put_parts")


def test_check_batch_and_first_positions() -> None:
    check_batch([b"a"], [b"1"])
    with pytest.raises(ValueError, match="1 keys but 0 buffers"):
        check_batch([b"a"], [], "buffers")
    assert first_positions([b"b", b"a", b"b", b"c", b"a"]) == {b"b": 0, b"a": 1, b"c": 3}


def test_map_batch_keeps_order_and_catches_per_item() -> None:
    from concurrent.futures import ThreadPoolExecutor

    def work(i: int) -> int:
        if i % 5 == 3:
            raise OSError(f"item {i}")
        return i * i

    with ThreadPoolExecutor(4) as pool:
        out = map_batch(pool, 4, work, list(range(20)))
        assert [r if not isinstance(r, Failed) else str(r.exc) for r in out] == [
            f"item {i}" if i % 5 == 3 else i * i for i in range(20)
        ]
        with pytest.raises(OSError, match="item 3"):  # the first in item order
            run_batch(pool, 4, work, list(range(20)))
        assert run_batch(pool, 4, lambda i: -i, list(range(7))) == [-i for i in range(7)]
    assert run_batch(None, 4, lambda i: i + 1, [1, 2]) == [2, 3]  # no pool: the caller alone


def test_run_batch_finishes_every_item_before_raising() -> None:
    from concurrent.futures import ThreadPoolExecutor

    done: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        if i == 0:
            raise RuntimeError("first")
        with lock:
            done.append(i)

    with ThreadPoolExecutor(3) as pool, pytest.raises(RuntimeError, match="first"):
        run_batch(pool, 3, work, list(range(10)))
    assert sorted(done) == list(range(1, 10))


def test_map_batch_lets_other_errors_through_after_the_batch() -> None:
    def work(i: int) -> int:
        if i == 2:
            raise KeyboardInterrupt
        return i

    with pytest.raises(KeyboardInterrupt):
        map_batch(None, 1, work, [0, 1, 2, 3], catch=OSError)
