"""Chain listeners: every block a tier stores or removes, capacity victims included."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from kvtier import Namespace, open_chain
from kvtier.chain import ChainEvent

NS = Namespace("chain-events", dtype="bfloat16", tokens_per_block=32)
BLOCK = 4096


def key(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"e"


def block(i: int) -> bytes:
    return (i.to_bytes(4, "big") * (BLOCK // 4))[:BLOCK]


class Recorder:
    def __init__(self) -> None:
        self.events: list[ChainEvent] = []
        self.lock = threading.Lock()

    def __call__(self, event: ChainEvent) -> None:
        with self.lock:
            self.events.append(event)

    def keys(self, kind: str, tier: str, reason: str | None = None) -> list[bytes]:
        with self.lock:
            return [k for e in self.events if e.kind == kind and e.tier == tier
                    and (reason is None or e.reason == reason) for k in e.keys]


def chain_config(tmp_path: Path, *, ram: int, disk: str, write: str) -> dict[str, Any]:
    return {"chain": [
        {"name": "ram", "backend": "host", "capacity": ram, "eviction": "lru"},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/disk",
         "capacity": disk, "write": write},
    ]}


def test_stores_demotions_and_ram_evictions_are_reported(tmp_path: Path) -> None:
    seen = Recorder()
    with open_chain(chain_config(tmp_path, ram=3 * BLOCK + 2048, disk="1GiB", write="back"),
                    namespace=NS) as chain:
        chain.add_listener(seen)
        keys = [key(i) for i in range(6)]
        assert chain.put(keys, [block(i) for i in range(6)]) == [True] * 6
        assert chain.flush(10)
        assert seen.keys("stored", "ram", "put") == keys
        victims = seen.keys("removed", "ram", "capacity")
        assert victims and set(victims) <= set(keys)
        assert sorted(seen.keys("stored", "disk", "demote")) == sorted(victims)
        # every victim is where the events say: gone from RAM, on disk
        assert chain.lookup(victims) == [1] * len(victims)
        assert chain.evict(keys[-1:]) == 1
        assert seen.keys("removed", "ram", "evict") == keys[-1:]
        chain.report_removed(1, victims[:1], "purge")
        assert seen.keys("removed", "disk", "purge") == victims[:1]
        chain.remove_listener(seen)
        before = len(seen.events)
        chain.put([key(50)], [block(50)])
        assert len(seen.events) == before


def test_capacity_evictions_in_a_lower_tier_are_reported(tmp_path: Path) -> None:
    seen = Recorder()
    # the disk holds 3 blocks (and their headers); RAM holds them all
    with open_chain(chain_config(tmp_path, ram=1 << 20, disk=str(3 * BLOCK + 2048),
                                 write="through"), namespace=NS) as chain:
        chain.add_listener(seen)
        for i in range(6):  # one at a time: each write lands before the next
            assert chain.put([key(i)], [block(i)]) == [True]
            assert chain.flush(10)
        evicted = seen.keys("removed", "disk", "capacity")
        assert len(evicted) >= 3
        stored = seen.keys("stored", "disk", "through")
        assert stored == [key(i) for i in range(6)]
        # an evicted block is really gone from the disk tier (RAM still has it)
        assert chain.tiers[1].lookup(evicted) == [False] * len(evicted)
        assert chain.tiers[0].lookup(evicted) == [True] * len(evicted)
        assert seen.keys("removed", "ram") == []


def test_a_failing_listener_never_reaches_the_caller(tmp_path: Path) -> None:
    def broken(event: ChainEvent) -> None:
        raise RuntimeError("listener bug")

    with open_chain({"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]},
                    namespace=NS) as chain:
        chain.add_listener(broken)
        assert chain.put([key(1)], [block(1)]) == [True]
        assert chain.evict([key(1)]) == 1
