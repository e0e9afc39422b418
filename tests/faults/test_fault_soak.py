"""Soak: 8 threads of puts, gets, lookups and evicts on a host -> fs -> fs chain.

Every block under a key is ``block_for(key, size_of(key))``, so any thread
can check any block it reads byte for byte.  Each thread owns a range of
keys that only it puts and evicts, and so knows which of its keys must be
found: one it stored and has not evicted since.  The last tier holds every
key at once, so no capacity eviction may lose one.  A miss of such a key
during the run is counted as transient (see test_fault_demotion_window.py);
after the run every one of them must be found, exact.  A sampler checks the
tiers' used bytes against their capacities all along, and RSS is compared
between the end of a warm-up and the end of the run.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from pathlib import Path

import pytest
from faultkit import Report, block_for, rss_bytes

import kvtier

NS = kvtier.Namespace("soak-model", dtype="bfloat16", tokens_per_block=16)
THREADS = 8
KEYS_PER_THREAD = 48
SIZES = (1, 4096, 16_384, 65_536 + 3, 131_072)
CAPACITY = {"ram": 2 << 20, "disk": 6 << 20}
RSS_BOUND = 64 << 20  # room for allocator noise; a leak per op outgrows it in seconds


def size_of(key: bytes) -> int:
    return SIZES[hashlib.blake2b(key, digest_size=1).digest()[0] % len(SIZES)]


def key_of(thread: int, index: int) -> bytes:
    return f"soak/{thread}/{index}".encode()


class Worker(threading.Thread):
    def __init__(self, chain: kvtier.Chain, number: int, stop: threading.Event) -> None:
        super().__init__(name=f"soak-{number}")
        self.chain, self.number, self.stop = chain, number, stop
        self.rng = random.Random(number)
        self.stored: set[bytes] = set()  # own keys stored and not evicted since
        self.ops = self.lost = self.wrong = self.found = 0
        self.errors: list[str] = []

    def pick(self, own: bool, n: int) -> list[bytes]:
        thread = self.number if own else self.rng.randrange(THREADS)
        return [key_of(thread, i) for i in self.rng.sample(range(KEYS_PER_THREAD), n)]

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                self.ops += 1
        except BaseException as exc:  # reported, not swallowed: the test fails on it
            self.errors.append(repr(exc))

    def step(self) -> None:
        roll = self.rng.random()
        if roll < 0.35:
            keys = self.pick(True, self.rng.randint(1, 4))
            flags = self.chain.put(keys, [block_for(k, size_of(k)) for k in keys])
            self.stored.update(k for k, f in zip(keys, flags) if f)
        elif roll < 0.85:
            keys = self.pick(self.rng.random() < 0.5, self.rng.randint(1, 4))
            outs = [bytearray(size_of(k)) for k in keys]
            for key, out, hit in zip(keys, outs, self.chain.get(keys, outs)):
                if hit:
                    self.found += 1
                    if bytes(out) != block_for(key, size_of(key)):
                        self.wrong += 1
                elif key in self.stored:
                    self.lost += 1
        elif roll < 0.95:
            keys = self.pick(self.rng.random() < 0.5, self.rng.randint(1, 4))
            where = self.chain.lookup(keys)
            self.lost += sum(w is None for k, w in zip(keys, where) if k in self.stored)
        else:
            keys = self.pick(True, self.rng.randint(1, 2))
            self.stored.difference_update(keys)
            self.chain.evict(keys)


@pytest.mark.parametrize("seconds", [pytest.param(5, id="ci"),
                                     pytest.param(60, id="long", marks=pytest.mark.slow)])
def test_soak(tmp_path: Path, fault_report: Report, seconds: int) -> None:
    config = {"chain": [
        {"name": "ram", "backend": "host", "capacity": CAPACITY["ram"], "eviction": "arc"},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/disk",
         "capacity": CAPACITY["disk"], "write": "back"},
        {"name": "deep", "backend": "fs", "url": f"file://{tmp_path}/deep", "write": "back",
         "codec": "zstd"},
    ]}
    stop = threading.Event()
    peaks = {"ram": 0, "disk": 0}
    over: list[str] = []
    with kvtier.open_chain(config, namespace=NS) as chain:
        workers = [Worker(chain, n, stop) for n in range(THREADS)]

        def sample() -> None:
            while not stop.is_set():
                for tier in chain.tiers[:2]:
                    used = tier.handle.stats()["used_bytes"]
                    peaks[tier.name] = max(peaks[tier.name], used)
                    if used > CAPACITY[tier.name]:
                        over.append(f"{tier.name}: {used} > {CAPACITY[tier.name]}")
                time.sleep(0.01)

        sampler = threading.Thread(target=sample)
        for worker in workers:
            worker.start()
        sampler.start()
        time.sleep(seconds * 0.2)  # warm-up: caches, pools and tiers fill
        rss_warm = rss_bytes()
        time.sleep(seconds * 0.8)
        rss_end = rss_bytes()
        stop.set()
        for thread in [*workers, sampler]:
            thread.join(120)
        assert chain.flush(120)
        # a last pass: every key some thread holds as stored is found and exact
        final_lost = final_wrong = 0
        for worker in workers:
            keys = sorted(worker.stored)
            outs = [bytearray(size_of(k)) for k in keys]
            for key, out, hit in zip(keys, outs, chain.get(keys, outs)):
                final_lost += not hit
                final_wrong += hit and bytes(out) != block_for(key, size_of(key))
        tiers = chain.stats()["tiers"]
    errors = [e for w in workers for e in w.errors]
    ops = sum(w.ops for w in workers)
    transient = sum(w.lost for w in workers)
    lost, wrong = final_lost, sum(w.wrong for w in workers) + final_wrong
    growth = rss_end - rss_warm
    assert errors == []
    assert (lost, wrong) == (0, 0)
    assert over == []
    assert sum(t["corrupt"] + t["errors"] for t in tiers) == 0
    assert ops > 0 and sum(w.found for w in workers) > 0
    assert growth < RSS_BOUND, f"RSS grew by {growth >> 20} MiB after the warm-up"
    variant = "long" if seconds >= 60 else "ci"
    fault_report.record(
        f"soak_{variant}", variant, seconds=seconds, threads=THREADS, ops=ops,
        hits_checked=sum(w.found for w in workers), lost=lost, wrong=wrong,
        transient_misses=transient, final_keys_checked=sum(len(w.stored) for w in workers),
        capacity_exceeded=len(over), peak_ram_bytes=peaks["ram"],
        peak_disk_bytes=peaks["disk"], ram_capacity_bytes=CAPACITY["ram"],
        disk_capacity_bytes=CAPACITY["disk"], rss_growth_bytes=growth,
        demoted=sum(t["demoted"] for t in tiers), evictions=sum(t["evictions"] for t in tiers),
    )
