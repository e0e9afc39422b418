"""The ``host`` backend (RAM tier), driven through the registry and BackendHandle."""

from __future__ import annotations

import array
import random
import sys
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvtier.plugins.registry import BackendHandle, default_registry
from kvtier.spec import BytesLike, ClosedError, ConfigError, KvtierError

NS = "0123456789abcdef0123456789abcdef"
MiB = 1024 * 1024
POLICIES = ("lru", "arc")


def open_host(capacity: int | str, eviction: str = "lru", **extra: object) -> BackendHandle:
    handle = default_registry().create("host")
    handle.open({"capacity": capacity, "eviction": eviction, **extra}, NS)
    return handle


@pytest.fixture(params=POLICIES)
def host(request: pytest.FixtureRequest) -> Iterator[BackendHandle]:
    handle = open_host(64 * MiB, request.param)
    yield handle
    handle.close()


def block(key: bytes, size: int, version: int = 0) -> bytes:
    """Deterministic pseudo-random content, different per key and version."""
    return random.Random(key + b"/" + str(version).encode()).randbytes(size)


def k(i: int | str) -> bytes:
    return f"key-{i}".encode()


def resident(handle: BackendHandle, keys: Sequence[bytes]) -> set[bytes]:
    return {key for key, hit in zip(keys, handle.lookup(keys), strict=True) if hit}


# --- registration, options, capabilities --------------------------------------


def test_entry_point_options_and_hooks() -> None:
    handle = default_registry().create("host")
    assert handle.info.value == "kvtier.backends.host:HostBackend"
    optional = ("kvtier_put_parts", "kvtier_get_into", "kvtier_tamper")
    assert all(handle.implements(hook) for hook in optional)
    opts = handle.options()
    assert set(opts) == {"capacity", "eviction", "max_block_size", "prefault"}
    assert opts["prefault"].type == "size" and opts["prefault"].default == "128MiB"
    assert opts["capacity"].type == "size" and opts["capacity"].required
    assert opts["capacity"].help
    assert opts["eviction"].type == "str"
    assert opts["eviction"].choices == ("lru", "arc")
    assert opts["eviction"].default == "lru"
    assert opts["max_block_size"].type == "size" and opts["max_block_size"].default is None


@pytest.mark.parametrize("eviction", POLICIES)
def test_capabilities_and_initial_stats(eviction: str) -> None:
    handle = open_host(1000, eviction, max_block_size=300)
    caps = handle.capabilities()
    assert (caps.persistent, caps.shared, caps.thread_safe) == (False, False, True)
    assert caps.capacity == 1000 and caps.max_block_size == 300
    assert caps.reports_evictions and caps.extra == {"eviction": eviction}
    stats = dict(handle.stats())
    expected = {"used_bytes": 0, "blocks": 0, "capacity_bytes": 1000, "evictions": 0}
    if eviction == "arc":
        expected["arc_p"] = 0
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


# --- data path ----------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 100, 4096, 65537, 8 * MiB])
def test_round_trip_sizes(host: BackendHandle, size: int) -> None:
    key, data = k(size), block(k(size), size)
    evicted: list[tuple[bytes, BytesLike]] = []
    assert list(host.put([key], [bytearray(data)], evicted)) == [True]
    assert evicted == []
    assert bytes(host.get([key])[0] or b"") == data
    out = bytearray(size)
    assert list(host.get_into([key], [[memoryview(out)]])) == [size]
    assert out == data
    # the same block through the gather path, as header + payload
    key2 = k(f"parts-{size}")
    parts: list[BytesLike] = [data[:1], memoryview(data)[1:]]
    assert list(host.put_parts([key2], [parts], evicted)) == [True]
    assert host.get([key2])[0] == data
    assert host.stats()["used_bytes"] == 2 * size


def test_mixed_hit_miss_batch(host: BackendHandle) -> None:
    keys = [k(i) for i in range(6)]
    blocks = {key: block(key, 10 + i) for i, key in enumerate(keys)}
    host.put(keys[::2], [blocks[key] for key in keys[::2]], [])
    got = host.get(keys)
    assert got == [blocks[key] if i % 2 == 0 else None for i, key in enumerate(keys)]
    assert list(host.lookup(keys)) == [i % 2 == 0 for i in range(6)]
    bufs = [[memoryview(bytearray(len(blocks[key])))] for key in keys]
    sizes = host.get_into(keys, bufs)
    assert list(sizes) == [len(blocks[key]) if i % 2 == 0 else None for i, key in enumerate(keys)]
    for i, key in enumerate(keys[::2]):
        assert bytes(bufs[2 * i][0]) == blocks[key]
    assert list(host.evict(keys)) == [i % 2 == 0 for i in range(6)]
    assert host.get(keys) == [None] * 6


def test_duplicate_keys_in_one_batch(host: BackendHandle) -> None:
    first, second = b"first", b"second!"
    assert list(host.put([b"a", b"a"], [first, second], [])) == [True, True]
    assert host.get([b"a", b"a"]) == [first, first]  # immutable per key: first one stays
    assert list(host.put_parts([b"b", b"b"], [[b"x"], [b"y", b"z"]], [])) == [True, True]
    assert host.get([b"b"]) == [b"x"]
    assert list(host.lookup([b"a", b"a"])) == [True, True]
    assert list(host.evict([b"a", b"a"])) == [True, False]
    assert host.stats()["blocks"] == 1 and host.stats()["used_bytes"] == 1


def test_empty_batches(host: BackendHandle) -> None:
    evicted: list[tuple[bytes, BytesLike]] = []
    assert list(host.put([], [], evicted)) == []
    assert list(host.put_parts([], [], evicted)) == []
    assert list(host.get([])) == []
    assert list(host.get_into([], [])) == []
    assert list(host.lookup([])) == []
    assert list(host.evict([])) == []
    assert evicted == []


def test_empty_block_is_a_hit_not_a_miss(host: BackendHandle) -> None:
    assert list(host.put([b"e"], [b""], [])) == [True]
    assert host.get([b"e"]) == [b""]
    assert list(host.lookup([b"e"])) == [True]
    assert list(host.get_into([b"e"], [[]])) == [0]
    assert list(host.evict([b"e"])) == [True]


def test_get_is_zero_copy_for_bytes_and_one_copy_otherwise(host: BackendHandle) -> None:
    data = block(b"z", 4096)
    host.put([b"z"], [data], [])
    assert host.get([b"z"])[0] is data
    source = bytearray(block(b"y", 100))
    host.put([b"y"], [source], [])
    source[:] = bytes(100)  # the caller reuses its buffer after the call
    got = host.get([b"y"])[0]
    assert type(got) is bytes and got == block(b"y", 100)
    assert host.get([b"y"])[0] is got  # get never copies what it stores
    floats = array.array("f", [1.0, 2.0, 3.0])  # a memoryview's len() is items, not bytes
    host.put([b"f"], [memoryview(floats)], [])
    assert host.get([b"f"])[0] == floats.tobytes()
    assert host.stats()["used_bytes"] == 4096 + 100 + 12


def test_put_parts_accepts_mixed_buffers(host: BackendHandle) -> None:
    parts: list[BytesLike] = [bytearray(b"head"), memoryview(b"--payload--")[2:-2], b"tail"]
    assert list(host.put_parts([b"p"], [parts], [])) == [True]
    assert host.get([b"p"]) == [b"headpayloadtail"]


def test_get_into_scatter_exact_and_wrong_size(host: BackendHandle) -> None:
    data = block(b"s", 1000)
    host.put([b"s"], [data], [])
    out = bytearray(1000)
    view = memoryview(out)
    scatter = [view[:10], view[10:10], view[10:600], view[600:]]
    assert list(host.get_into([b"s"], [scatter])) == [1000]
    assert out == data
    for wrong in (999, 1001):
        buf = bytearray(b"\xaa" * wrong)
        assert list(host.get_into([b"s"], [[memoryview(buf)]])) == [1000]
        assert buf == b"\xaa" * wrong  # nothing written on a size mismatch
    wide = array.array("H", bytes(1000))  # a non-byte memoryview is filled by bytes
    assert list(host.get_into([b"s"], [[memoryview(wide)]])) == [1000]
    assert wide.tobytes() == data
    assert list(host.get_into([b"missing"], [[memoryview(bytearray(4))]])) == [None]


def test_put_of_stored_key_keeps_data_and_counts_as_use() -> None:
    handle = open_host(300)
    handle.put([b"a", b"b", b"c"], [b"A" * 100, b"B" * 100, b"C" * 100], [])
    assert list(handle.put([b"a"], [b"X" * 100], [])) == [True]  # a is now most recent
    assert handle.get([b"a"]) == [b"A" * 100]
    evicted: list[tuple[bytes, BytesLike]] = []
    handle.put([b"d"], [b"D" * 100], evicted)
    assert evicted == [(b"b", b"B" * 100)]


def test_lookup_is_not_a_use() -> None:
    handle = open_host(200)
    handle.put([b"a", b"b"], [b"A" * 100, b"B" * 100], [])
    assert list(handle.lookup([b"a"])) == [True]
    evicted: list[tuple[bytes, BytesLike]] = []
    handle.put([b"c"], [b"C" * 100], evicted)
    assert [key for key, _ in evicted] == [b"a"]


@pytest.mark.parametrize("eviction", POLICIES)
def test_oversize_blocks_are_refused_without_evicting(eviction: str) -> None:
    handle = open_host(1000, eviction, max_block_size=600)
    handle.put([b"a", b"b"], [b"a" * 400, b"b" * 400], [])
    evicted: list[tuple[bytes, BytesLike]] = []
    ok = handle.put([b"big", b"huge", b"c"], [b"x" * 601, b"y" * 5000, b"c" * 100], evicted)
    assert list(ok) == [False, False, True]
    assert list(handle.put_parts([b"big2"], [[b"x" * 300, b"y" * 301]], evicted)) == [False]
    assert evicted == []
    assert list(handle.lookup([b"a", b"b", b"c", b"big", b"huge", b"big2"])) == [
        True, True, True, False, False, False,
    ]
    assert list(handle.put([b"max"], [b"m" * 600], evicted)) == [True]
    assert handle.stats()["used_bytes"] <= 1000
    # a block exactly the capacity is accepted and pushes everything else out
    whole = open_host(1000, eviction)
    whole.put([b"a", b"b"], [b"a" * 500, b"b" * 500], [])
    evicted = []
    assert list(whole.put([b"all"], [b"z" * 1000], evicted)) == [True]
    assert sorted(key for key, _ in evicted) == [b"a", b"b"]
    assert whole.stats()["used_bytes"] == 1000


def test_explicit_evict_is_not_reported_or_counted(host: BackendHandle) -> None:
    evicted: list[tuple[bytes, BytesLike]] = []
    host.put([b"a"], [b"aaa"], evicted)
    assert list(host.evict([b"a", b"nope"])) == [True, False]
    assert evicted == []
    assert host.stats()["evictions"] == 0 and host.stats()["used_bytes"] == 0


@pytest.mark.parametrize("eviction", POLICIES)
def test_capacity_never_exceeded_and_evictions_exact(eviction: str) -> None:
    capacity = 20_000
    handle = open_host(capacity, eviction)
    rng = random.Random(7)
    pool = [k(i) for i in range(120)]
    shadow: dict[bytes, bytes] = {}  # bytes of every block stored so far
    total_evicted = 0
    for step in range(300):
        before = resident(handle, pool)
        candidates = [key for key in pool if key not in before]
        keys = rng.sample(candidates, rng.randint(0, 6))
        blocks = {key: block(key, rng.choice([0, 1, 50, 900, 3000, 7000]), step) for key in keys}
        evicted: list[tuple[bytes, BytesLike]] = []
        ok = handle.put(keys, [blocks[key] for key in keys], evicted)
        assert all(ok)
        if rng.random() < 0.5:
            handle.get(rng.sample(pool, 10))
        stats = handle.stats()
        assert stats["used_bytes"] <= capacity
        after = resident(handle, pool)
        disappeared = (before | set(keys)) - after
        assert Counter(key for key, _ in evicted) == Counter(disappeared)
        for key, data in evicted:  # exact bytes of what was pushed out
            assert bytes(data) == (blocks[key] if key in blocks else shadow[key])
        shadow.update(blocks)
        assert stats["blocks"] == len(after)
        assert stats["used_bytes"] == sum(len(shadow[key]) for key in after)
        total_evicted += len(evicted)
    assert total_evicted > 100
    assert handle.stats()["evictions"] == total_evicted


# --- eviction order --------------------------------------------------------------


class ReferenceLru:
    """The LRU the host backend must match exactly."""

    def __init__(self, capacity: int, limit: int) -> None:
        self.capacity, self.limit = capacity, limit
        self.blocks: OrderedDict[bytes, bytes] = OrderedDict()

    def used(self) -> int:
        return sum(map(len, self.blocks.values()))

    def put(
        self, keys: Sequence[bytes], blocks: Sequence[bytes], evicted: list[object]
    ) -> list[bool]:
        out = []
        for key, data in zip(keys, blocks, strict=True):
            if key in self.blocks:
                self.blocks.move_to_end(key)
                out.append(True)
            elif len(data) > self.limit:
                out.append(False)
            else:
                while self.used() + len(data) > self.capacity:
                    evicted.append(self.blocks.popitem(last=False))
                self.blocks[key] = data
                out.append(True)
        return out

    def get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        out = []
        for key in keys:
            data = self.blocks.get(key)
            if data is not None:
                self.blocks.move_to_end(key)
            out.append(data)
        return out


def test_lru_order_matches_reference_model() -> None:
    capacity, limit = 5000, 2000
    handle = open_host(capacity, "lru", max_block_size=limit)
    model = ReferenceLru(capacity, limit)
    rng = random.Random(11)
    pool = [k(i) for i in range(30)]
    for step in range(800):
        keys = [rng.choice(pool) for _ in range(rng.randint(0, 5))]
        op = rng.choice(["put", "put", "get", "get_into", "lookup", "evict"])
        if op == "put":
            blocks = [block(key, rng.choice([0, 10, 400, 1000, 1999, 2001]), step) for key in keys]
            got_ev: list[tuple[bytes, BytesLike]] = []
            want_ev: list[object] = []
            assert list(handle.put(keys, blocks, got_ev)) == model.put(keys, blocks, want_ev)
            assert got_ev == want_ev
        elif op == "get":
            assert list(handle.get(keys)) == model.get(keys)
        elif op == "get_into":
            want = model.get(keys)
            bufs = [[memoryview(bytearray(len(d) if d is not None else 1))] for d in want]
            sizes = handle.get_into(keys, bufs)
            assert list(sizes) == [None if d is None else len(d) for d in want]
            for d, buf in zip(want, bufs, strict=True):
                if d is not None:
                    assert bytes(buf[0]) == d
        elif op == "lookup":
            assert list(handle.lookup(keys)) == [key in model.blocks for key in keys]
        else:
            want_gone = []
            for key in keys:
                want_gone.append(model.blocks.pop(key, None) is not None)
            assert list(handle.evict(keys)) == want_gone
        stats = handle.stats()
        assert stats["used_bytes"] == model.used() <= capacity
        assert stats["blocks"] == len(model.blocks)
        assert resident(handle, pool) == set(model.blocks)


def scan_workload(eviction: str) -> tuple[int, set[bytes]]:
    """A hot working set re-read between bursts of one-off blocks (a long scan)."""
    handle = open_host(8 * 1024, eviction)
    hot = [k(f"hot-{i}") for i in range(3)]
    hot_blocks = [block(key, 1024) for key in hot]
    handle.put(hot, hot_blocks, [])
    handle.get(hot)
    hits = 0
    for burst in range(10):
        scan = [k(f"scan-{burst}-{i}") for i in range(10)]  # more than the tier holds
        for key in scan:
            handle.put([key], [block(key, 1024)], [])
        got = handle.get(hot)
        for key, data, want in zip(hot, got, hot_blocks, strict=True):
            if data is None:
                handle.put([key], [want], [])  # as the chain would, after a miss
            else:
                assert data == want
                hits += 1
    survivors = resident(handle, hot + [k(f"scan-9-{i}") for i in range(10)])
    return hits, survivors


def test_arc_resists_scans_where_lru_does_not() -> None:
    lru_hits, lru_left = scan_workload("lru")
    arc_hits, arc_left = scan_workload("arc")
    hot = {k(f"hot-{i}") for i in range(3)}
    assert lru_hits == 0  # every burst flushes the hot set under LRU
    assert arc_hits == 30  # ARC serves the hot set every time
    assert hot <= arc_left
    assert arc_left - hot == {k(f"scan-9-{i}") for i in range(5, 10)}
    assert hot <= lru_left  # re-put after the last miss, so recent again
    assert lru_left - hot == {k(f"scan-9-{i}") for i in range(5, 10)}


def test_arc_ghost_hits_adapt_p() -> None:
    handle = open_host(400, "arc")
    blk = {key: key * 100 for key in (b"A", b"B", b"C", b"D", b"E", b"F")}

    def put(key: bytes) -> list[tuple[bytes, BytesLike]]:
        evicted: list[tuple[bytes, BytesLike]] = []
        assert list(handle.put([key], [blk[key]], evicted)) == [True]
        return evicted

    handle.put([b"A", b"B", b"C", b"D"], [blk[x] for x in (b"A", b"B", b"C", b"D")], [])
    handle.get([b"D"])  # T1 = A B C, T2 = D
    assert put(b"E") == [(b"A", blk[b"A"])]  # A leaves a ghost in B1
    assert handle.stats()["arc_p"] == 0
    # a ghost hit in B1: T1 was too small, so its target grows by A's size,
    # A comes back into T2, and T1 (above its target) gives up its oldest
    assert put(b"A") == [(b"B", blk[b"B"])]
    assert handle.stats()["arc_p"] == 100
    handle.get([b"C", b"E"])  # T1 empty, T2 = D A C E
    assert put(b"F") == [(b"D", blk[b"D"])]  # T1 was empty: T2's oldest goes, ghost in B2
    # a ghost hit in B2 shrinks the target back; T1 (at its target) gives up F
    assert put(b"D") == [(b"F", blk[b"F"])]
    assert handle.stats()["arc_p"] == 0
    assert resident(handle, list(blk)) == {b"A", b"C", b"D", b"E"}
    assert handle.stats()["used_bytes"] == 400 and handle.stats()["evictions"] == 4


def test_arc_full_t1_keeps_no_ghost() -> None:
    # |T1| = c leaves no room for B1 (|T1| + |B1| <= c): a re-put is a plain miss
    handle = open_host(400, "arc")
    for key in (b"A", b"B", b"C", b"D", b"E"):
        handle.put([key], [key * 100], [])
    handle.put([b"A"], [b"A" * 100], [])
    assert handle.stats()["arc_p"] == 0
    assert resident(handle, [b"A", b"B", b"C", b"D", b"E"]) == {b"A", b"C", b"D", b"E"}


class PaperArc:
    """ARC as in Megiddo & Modha's Fig. 4, over pages of ``size`` bytes, p in bytes.

    Written from the paper's four cases, independently of the backend's byte
    form (which makes room in a loop and trims ghosts afterwards): with equal
    block sizes the two must agree on every eviction and on p.
    """

    def __init__(self, pages: int, size: int) -> None:
        self.c, self.size, self.p = pages, size, 0
        self.t1: OrderedDict[bytes, None] = OrderedDict()
        self.t2: OrderedDict[bytes, None] = OrderedDict()
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()

    def get(self, x: bytes) -> None:
        if x in self.t1:  # Case I
            del self.t1[x]
            self.t2[x] = None
        elif x in self.t2:
            self.t2.move_to_end(x)

    def put(self, x: bytes, evicted: list[bytes]) -> None:
        if x in self.t1 or x in self.t2:
            self.get(x)
            return
        b1, b2, s = len(self.b1), len(self.b2), self.size
        if x in self.b1:  # Case II
            self.p = min(self.p + (s if b1 >= b2 else s * b2 // b1), self.c * s)
            self._replace(x, evicted)
            del self.b1[x]
            self.t2[x] = None
            return
        if x in self.b2:  # Case III
            self.p = max(self.p - (s if b2 >= b1 else s * b1 // b2), 0)
            self._replace(x, evicted)
            del self.b2[x]
            self.t2[x] = None
            return
        l1 = len(self.t1) + b1  # Case IV
        total = l1 + len(self.t2) + b2
        if l1 == self.c:
            if len(self.t1) < self.c:
                self.b1.popitem(last=False)
                self._replace(x, evicted)
            else:
                evicted.append(self.t1.popitem(last=False)[0])
        elif total >= self.c:
            if total == 2 * self.c:
                self.b2.popitem(last=False)
            self._replace(x, evicted)
        self.t1[x] = None

    def _replace(self, x: bytes, evicted: list[bytes]) -> None:
        t1 = len(self.t1) * self.size
        if self.t1 and ((x in self.b2 and t1 == self.p) or t1 > self.p):
            key = self.t1.popitem(last=False)[0]
            self.b1[key] = None
        else:
            key = self.t2.popitem(last=False)[0]
            self.b2[key] = None
        evicted.append(key)


@pytest.mark.parametrize("seed", range(4))
def test_arc_matches_the_paper_for_equal_sizes(seed: int) -> None:
    pages, size = 8, 100
    handle = open_host(pages * size, "arc")
    paper = PaperArc(pages, size)
    rng = random.Random(seed)
    hot = [k(f"hot-{i}") for i in range(6)]
    cold = [k(f"cold-{i}") for i in range(40)]
    for _ in range(600):
        keys = [rng.choice(hot if rng.random() < 0.5 else cold) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.6:
            got: list[tuple[bytes, BytesLike]] = []
            handle.put(keys, [key.ljust(size, b".") for key in keys], got)
            want: list[bytes] = []
            for key in keys:
                paper.put(key, want)
            assert [key for key, _ in got] == want
            assert all(bytes(data) == key.ljust(size, b".") for key, data in got)
        else:
            handle.get(keys)
            for key in keys:
                paper.get(key)
        assert handle.stats()["arc_p"] == paper.p
        assert resident(handle, hot + cold) == set(paper.t1) | set(paper.t2)


# --- model-based property test -----------------------------------------------------


KEYS = [k(i) for i in range(10)]


class HostMachine(RuleBasedStateMachine):
    """The backend against a dict of what it should hold, for both policies."""

    capacity = 4000

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[bytes, bytes] = {}
        self.version = 0
        self.handle: BackendHandle | None = None
        self.limit = self.capacity

    @initialize(eviction=st.sampled_from(POLICIES), max_block=st.sampled_from([None, 2500]))
    def open(self, eviction: str, max_block: int | None) -> None:
        self.handle = open_host(self.capacity, eviction, max_block_size=max_block)
        self.limit = max_block or self.capacity

    @property
    def h(self) -> BackendHandle:
        assert self.handle is not None
        return self.handle

    @rule(
        batch=st.lists(
            st.tuples(st.sampled_from(KEYS), st.sampled_from([0, 1, 200, 999, 2400, 2600, 4001])),
            max_size=6,
            unique_by=lambda t: t[0],
        ),
        gather=st.booleans(),
    )
    def put(self, batch: list[tuple[bytes, int]], gather: bool) -> None:
        self.version += 1
        keys = [key for key, _ in batch]
        data = {key: block(key, size, self.version) for key, size in batch}
        evicted: list[tuple[bytes, BytesLike]] = []
        if gather:
            parts = [[data[key][:3], data[key][3:]] for key in keys]
            ok = self.h.put_parts(keys, parts, evicted)
        else:
            ok = self.h.put(keys, [data[key] for key in keys], evicted)
        before = set(self.model)
        for key, stored in zip(keys, ok, strict=True):
            if len(data[key]) <= self.limit:
                assert stored
            elif key not in before:
                assert not stored
            if stored and key not in self.model:
                self.model[key] = data[key]
        for key, gone in evicted:
            if key in self.model:
                assert bytes(gone) == self.model.pop(key)
            else:  # pushed out, stored again and pushed out again in this batch
                assert bytes(gone) == data[key]
        for key in resident(self.h, KEYS) - set(self.model):
            # pushed out by an earlier block of this batch, then stored anew
            assert key in data and ok[keys.index(key)]
            self.model[key] = data[key]

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=6))
    def get(self, keys: list[bytes]) -> None:
        assert list(self.h.get(keys)) == [self.model.get(key) for key in keys]

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=6), delta=st.sampled_from([0, 0, 1, -1]))
    def get_into(self, keys: list[bytes], delta: int) -> None:
        bufs = [bytearray(max(len(self.model.get(key, b"")) + delta, 0)) for key in keys]
        sizes = self.h.get_into(keys, [[memoryview(buf)] for buf in bufs])
        for key, size, buf in zip(keys, sizes, bufs, strict=True):
            want = self.model.get(key)
            assert size == (None if want is None else len(want))
            if want is not None and len(buf) == len(want):
                assert buf == want

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=4))
    def evict(self, keys: list[bytes]) -> None:
        want = [self.model.pop(key, None) is not None for key in keys]
        assert list(self.h.evict(keys)) == want

    @rule()
    def read_everything(self) -> None:
        keys = list(self.model)
        assert list(self.h.get(keys)) == [self.model[key] for key in keys]

    @invariant()
    def consistent(self) -> None:
        if self.handle is None:
            return
        stats = self.h.stats()
        assert stats["used_bytes"] <= self.capacity
        assert stats["used_bytes"] == sum(map(len, self.model.values()))
        assert stats["blocks"] == len(self.model)
        assert resident(self.h, KEYS) == set(self.model)

    def teardown(self) -> None:
        if self.handle is not None:
            self.handle.close()


TestHostMachine = HostMachine.TestCase
TestHostMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# --- threads ------------------------------------------------------------------------


@pytest.mark.parametrize("eviction", POLICIES)
def test_threads_never_see_wrong_bytes(eviction: str) -> None:
    capacity = 32 * 1024
    handle = open_host(capacity, eviction)
    shared = [k(f"shared-{i}") for i in range(16)]
    everything = shared + [k(f"t{s}-{i}") for s in range(4) for i in range(16)]
    # content-addressed, so any thread's put of a key stores the same bytes
    content = {key: block(key, 100 + sum(key) * 37 % 3000) for key in everything}
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        mine = [k(f"t{seed}-{i}") for i in range(16)]
        try:
            for _ in range(3000):
                keys = rng.sample(mine + shared, rng.randint(1, 4))
                op = rng.random()
                if op < 0.4:
                    evicted: list[tuple[bytes, BytesLike]] = []
                    blocks = [bytearray(content[key]) if op < 0.1 else content[key] for key in keys]
                    assert all(handle.put(keys, blocks, evicted))
                    for key, data in evicted:
                        assert bytes(data) == content[key]
                elif op < 0.7:
                    for key, got in zip(keys, handle.get(keys), strict=True):
                        assert got is None or got == content[key]
                elif op < 0.85:
                    bufs = [bytearray(len(content[key])) for key in keys]
                    sizes = handle.get_into(keys, [[memoryview(b)] for b in bufs])
                    for key, size, buf in zip(keys, sizes, bufs, strict=True):
                        assert size is None or (size == len(buf) and buf == content[key])
                else:
                    handle.evict(keys)
        except BaseException as exc:
            errors.append(exc)

    def monitor() -> None:
        last = 0
        try:
            while not stop.is_set():
                stats = handle.stats()
                assert 0 <= stats["used_bytes"] <= capacity
                assert stats["evictions"] >= last
                last = int(stats["evictions"])
        except BaseException as exc:
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
        watcher = threading.Thread(target=monitor)
        watcher.start()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        stop.set()
        watcher.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
    held = [key for key in everything if key in resident(handle, everything)]
    assert handle.get(held) == [content[key] for key in held]
    stats = handle.stats()
    assert stats["blocks"] == len(held)
    assert stats["used_bytes"] == sum(len(content[key]) for key in held) <= capacity
    assert stats["evictions"] > 0


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
