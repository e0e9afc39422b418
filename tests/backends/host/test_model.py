"""The ``host`` backend against a dict of what it should hold: a Hypothesis state machine."""

from __future__ import annotations

from host_blocks import POLICIES, block, k, open_host, resident
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvtier.plugins.registry import BackendHandle
from kvtier.spec import BytesLike

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
