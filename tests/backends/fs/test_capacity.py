"""The ``fs`` backend's capacity: LRU eviction, reported evictions, blocks that do not fit."""

from __future__ import annotations

import random

from fs_blocks import Opener, as_bytes, blob, files_under

from kvtier.spec import BytesLike

# ---------------------------------------------------------------------------
# capacity and eviction
# ---------------------------------------------------------------------------


def test_capacity_lru_and_evicted_reports(url: str, opener: Opener) -> None:
    cap = 50_000
    tier = opener(url, capacity=cap)
    assert tier.capabilities().capacity == cap
    assert tier.capabilities().reports_evictions
    rng = random.Random(42)
    model: dict[bytes, bytes] = {}  # what should be stored
    for step in range(60):
        batch = rng.choice([1, 1, 2, 5])
        keys = [f"c{step}-{j}".encode() for j in range(batch)]
        blocks = [blob(rng.randint(1, 12_000), step * 10 + j) for j in range(batch)]
        evicted: list[tuple[bytes, BytesLike]] = []
        assert list(tier.put(keys, blocks, evicted)) == [True] * batch
        model.update(zip(keys, blocks, strict=True))
        for key, data in evicted:
            assert model.pop(key) == bytes(data)  # exactly the removed keys, with their bytes
        stats = tier.stats()
        assert stats["used_bytes"] <= cap
        assert stats["used_bytes"] == sum(map(len, model.values()))
        assert stats["blocks"] == len(model)
        if step % 7 == 0 and model:
            # reading a block makes it the most recently used
            hot = next(iter(model))
            assert as_bytes(tier.get([hot])[0]) == model[hot]
            model[hot] = model.pop(hot)
    all_keys = [f"c{s}-{j}".encode() for s in range(60) for j in range(5)]
    found = dict(zip(all_keys, tier.get(all_keys), strict=True))
    assert {k: bytes(v) for k, v in found.items() if v is not None} == model


def test_capacity_evicts_in_lru_order(url: str, opener: Opener) -> None:
    tier = opener(url, capacity=3000)
    for key in (b"a", b"b", b"c"):
        assert all(tier.put([key], [blob(1000, key[0])], []))
    assert tier.get([b"a"])[0] is not None  # a is now the most recent
    evicted: list[tuple[bytes, BytesLike]] = []
    assert all(tier.put([b"d"], [blob(1000, 100)], evicted))
    assert [k for k, _ in evicted] == [b"b"]
    assert list(tier.lookup([b"a", b"b", b"c", b"d"])) == [True, False, True, True]


def test_batch_larger_than_capacity_behaves_like_single_puts(url: str, opener: Opener) -> None:
    tier = opener(url, capacity=3000)
    keys = [f"b{i}".encode() for i in range(5)]
    blocks = [blob(1000, i) for i in range(5)]
    evicted: list[tuple[bytes, BytesLike]] = []
    assert list(tier.put(keys, blocks, evicted)) == [True] * 5
    # the two oldest were pushed out by the later ones, bytes reported all the same
    assert [(k, bytes(v)) for k, v in evicted] == list(zip(keys[:2], blocks[:2], strict=True))
    assert list(tier.lookup(keys)) == [False, False, True, True, True]
    assert tier.stats()["used_bytes"] == 3000
    if url.startswith("file://"):
        assert len(files_under(url)) == 3


def test_block_larger_than_capacity_is_refused(url: str, opener: Opener) -> None:
    tier = opener(url, capacity=1000)
    evicted: list[tuple[bytes, BytesLike]] = []
    assert all(tier.put([b"small"], [blob(1000)], evicted))
    assert list(tier.put([b"big", b"ok"], [blob(1001), blob(10)], evicted)) == [False, True]
    assert [k for k, _ in evicted] == [b"small"]
    assert tier.get([b"big"]) == [None]
    assert tier.stats()["used_bytes"] == 10


def test_evict_is_not_reported_as_eviction(url: str, opener: Opener) -> None:
    tier = opener(url, capacity=10_000)
    assert all(tier.put([b"x"], [blob(100)], []))
    assert list(tier.evict([b"x", b"never"])) == [True, False]
    assert tier.stats()["evictions"] == 0
    assert tier.stats()["used_bytes"] == 0
