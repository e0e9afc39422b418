"""Group ``stateful``: Hypothesis drives the backend against a dict, step by step.

The model is a plain ``dict`` of key to bytes, written here and sharing no
code with kvtier.  Hypothesis picks sequences of put, get, lookup, evict and
(for persistent backends) reopen over a small pool of keys, so repeats,
evictions of missing keys and re-puts after evicts all happen, and shrinks
any failure to a short sequence printed with the error.
"""

from __future__ import annotations

import secrets
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from .base import KitBackend, KitBase, kit_group
from .data import block_for, describe

__all__ = ["DictModel", "StatefulTests"]

#: Keys of the machine: short and long, sharing prefixes, differing in one byte.
POOL = (b"\x00", b"a", b"ab", b"b" * 64, b"b" * 63 + b"c", b"key/1", b"key/2", b"\xff" * 9)
#: Sizes, tied to the key so a re-put of a key is always the same block.
SIZES = (1, 4096, 100, 70_001, 7, 65_536, 2, 1500)


class DictModel:
    """What a correct backend holds: a dict, and what capacity may take away."""

    def __init__(self, capacity: int | None, reports_evictions: bool) -> None:
        self.blocks: dict[bytes, bytes] = {}
        # a backend with a capacity that does not report evictions may drop
        # any block silently; the model then learns of it from a miss
        self.silent = capacity is not None and not reports_evictions

    def put(self, key: bytes, block: bytes) -> None:
        """A put: a key already held keeps its block (the first put of a batch wins too)."""
        self.blocks.setdefault(key, block)

    def evicted(self, key: bytes, block: bytes) -> str | None:
        """Record a reported eviction; the reason it is wrong, if it is."""
        held = self.blocks.pop(key, None)
        if held is None:
            return f"{key!r} was reported evicted but the model does not hold it"
        if held != block:
            return f"eviction of {key!r} reported {describe(held, block)}"
        return None

    def expect(self, key: bytes, found: bool) -> bytes | None:
        """The block a read of ``key`` must answer, given whether the backend found it."""
        if not found and self.silent:
            self.blocks.pop(key, None)
        return self.blocks.get(key)

    def remove(self, key: bytes) -> bool:
        return self.blocks.pop(key, None) is not None


@kit_group("stateful")
class StatefulTests(KitBase):
    """Runs for every backend; reopens only persistent ones."""

    def _stateful_machine(self) -> type[RuleBasedStateMachine]:
        kit = self
        caps = self.caps
        limit = self.block_limit()
        sizes = {k: max(1, min(s, limit or s)) for k, s in zip(POOL, SIZES)}
        blocks = {k: block_for(k, sizes[k]) for k in POOL}
        key_lists = st.lists(st.sampled_from(POOL), max_size=5)

        class BackendMachine(RuleBasedStateMachine):
            def __init__(self) -> None:
                super().__init__()
                # every example gets a fresh instance and namespace: nothing
                # of an earlier example may answer in this one
                self.namespace = secrets.token_hex(16)
                self.store: KitBackend = kit.open_backend(self.namespace)
                self.model = DictModel(caps.capacity, caps.reports_evictions)

            @rule(keys=key_lists)
            def put(self, keys: list[bytes]) -> None:
                evicted: list[tuple[bytes, bytes]] = []
                flags = self.store.put(keys, [blocks[k] for k in keys], evicted)
                for key, flag in zip(keys, flags):
                    assert flag, f"put refused {key!r} ({sizes[key]} bytes, within limits)"
                    self.model.put(key, blocks[key])
                for key, block in evicted:
                    problem = self.model.evicted(key, block)
                    assert problem is None, problem
                # a key repeated in the batch may be pushed out by a block after
                # its first mention and stored again by a later one: only the
                # backend knows whether it holds the key now
                again = sorted({k for k, _ in evicted} & set(keys))
                for key, have in zip(again, self.store.get(again)):
                    if have is not None:
                        assert have == blocks[key], (
                            f"get({key!r}) returned {describe(blocks[key], have)}"
                        )
                        self.model.put(key, have)
                self.check_get(keys)  # read your writes

            @rule(keys=key_lists)
            def get(self, keys: list[bytes]) -> None:
                self.check_get(keys)

            @rule(keys=key_lists)
            def lookup(self, keys: list[bytes]) -> None:
                self.check_lookup(keys)

            @rule(keys=key_lists)
            def evict(self, keys: list[bytes]) -> None:
                for key, removed in zip(keys, self.store.evict(keys)):
                    want = self.model.remove(key)
                    if self.model.silent and not removed:
                        continue  # capacity may have dropped it unreported
                    assert removed is want, f"evict({key!r}) answered {removed}, expected {want}"
                self.check_get(keys)  # gone means gone, for get as well as lookup

            def check_get(self, keys: list[bytes]) -> None:
                for key, have in zip(keys, self.store.get(keys)):
                    want = self.model.expect(key, have is not None)
                    assert have == want, f"get({key!r}) returned {describe(want, have)}"

            def check_lookup(self, keys: list[bytes]) -> None:
                for key, hit in zip(keys, self.store.lookup(keys)):
                    want = self.model.expect(key, hit) is not None
                    if kit.lookup_exact or not hit:
                        assert hit is want, f"lookup({key!r}) answered {hit}, expected {want}"

            @precondition(lambda self: caps.persistent)
            @rule()
            def reopen(self) -> None:
                self.store.close()
                self.store = kit.open_backend(self.namespace)

            @invariant()
            def index_agrees(self) -> None:
                self.check_lookup(list(POOL))  # cheap: no block is read

            @invariant()
            def within_capacity(self) -> None:
                if caps.capacity is None:
                    return
                used = self.store.stats().get("used_bytes")
                assert used is None or used <= caps.capacity, (
                    f"stats() reports used_bytes={used} > capacity {caps.capacity}"
                )

            def teardown(self) -> None:
                self.store.close()

        return BackendMachine

    def test_backend_behaves_like_a_dict(self) -> None:
        config: dict[str, Any] = {
            "max_examples": self.stateful_max_examples,
            "stateful_step_count": self.stateful_step_count,
            "deadline": None,
            # the kit must not leave a .hypothesis directory in the author's tree
            "database": None,
            # the same sequences on every run: a certification must not flicker
            "derandomize": self.stateful_derandomize,
            "suppress_health_check": list(HealthCheck),
        }
        run_state_machine_as_test(self._stateful_machine(), settings=settings(**config))
