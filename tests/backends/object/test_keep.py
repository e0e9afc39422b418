"""Keep (retention marks) on the ``object`` tier, against a real S3 server (SeaweedFS).

A kept block is no victim of the instance's bound (``min(capacity, quota)``),
within the tenant's ``keep`` budget; a put only kept blocks could make room
for is refused before its upload; expiry and an explicit evict still remove a
kept block, its mark with it.  Every claim is read back from the bucket, byte
for byte, through a second instance whose index and cache know nothing of the
first's.
"""

from __future__ import annotations

import time
from functools import partial

import pytest
from object_blocks import Blocks, Opener, blob

from kvtier.plugins.registry import BackendHandle

NS = "c" * 32
RULES = {"*": {"keep": 3000}}
BLOCKS = Blocks(b"keep")
key, in_bucket = BLOCKS.key, BLOCKS.exact


@pytest.fixture
def open_object(open_object: Opener) -> Opener:
    """The conftest's opener, in this module's namespace."""
    return partial(open_object, NS)


def flood(handle: BackendHandle, start: int, count: int) -> None:
    for i in range(start, start + count):
        assert handle.put([key(i)], [blob(i)], []) == [True]


@pytest.mark.parametrize("eviction", ["fifo", "s3fifo"])
def test_kept_blocks_outlive_a_flood_within_the_budget(open_object: Opener,
                                                        eviction: str) -> None:
    tier = open_object(capacity=10_000, eviction=eviction, tenants=RULES)
    reader = open_object()  # no capacity: an index nor marks of its own
    flood(tier, 0, 4)
    assert tier.keep([key(0), key(1), key(2), key(99)], True) == [True, True, True, None]
    assert tier.keep([key(3)], True) == [False]  # beyond the 3000 bytes of the budget
    assert tier.keep([key(0)], True) == [True]  # marked again: counted once
    flood(tier, 100, 40)  # four times the capacity
    assert in_bucket(reader, [0, 1, 2, 3]) == [0, 1, 2]
    stats = dict(tier.stats())
    assert stats["used_bytes"] <= 10_000 and stats["blocks"] == len(in_bucket(
        reader, [0, 1, 2, *range(100, 140)]))
    assert (stats["kept_bytes"], stats["kept_blocks"], stats["keep_refused"]) == (3000, 3, 1)
    # released, they go as any other block (fifo: the oldest; S3-FIFO keeps blocks of
    # its main queue, where the spared ones went, while one-hit blocks pass through)
    assert tier.keep([key(0), key(1), key(2), key(99)], False) == [True, True, True, None]
    assert dict(tier.stats())["kept_bytes"] == 0
    flood(tier, 200, 40)
    if eviction == "fifo":
        assert in_bucket(reader, [0, 1, 2]) == []


def test_a_put_only_kept_blocks_could_make_room_for_is_refused(open_object: Opener) -> None:
    tier = open_object(capacity=3000, tenants=RULES)
    reader = open_object()
    flood(tier, 0, 3)
    assert tier.keep([key(0), key(1), key(2)], True) == [True] * 3
    assert tier.put([key(5)], [blob(5)], []) == [False]
    assert reader.lookup([key(5)]) == [False], "a refused block was uploaded"
    assert in_bucket(reader, [0, 1, 2]) == [0, 1, 2]
    assert dict(tier.stats())["tenant_refused.default"] == 1
    assert tier.keep([key(1)], False) == [True]
    assert tier.put([key(5)], [blob(5)], []) == [True]  # key 1 gives its room now
    assert in_bucket(reader, [0, 1, 2, 5]) == [0, 2, 5]


def test_evict_removes_a_kept_block_and_a_stored_again_block_is_unmarked(
        open_object: Opener) -> None:
    tier = open_object(capacity=10_000, tenants=RULES)
    reader = open_object()
    flood(tier, 0, 1)
    assert tier.keep([key(0)], True) == [True]
    assert tier.evict([key(0)]) == [True]
    assert dict(tier.stats())["kept_bytes"] == 0
    assert tier.keep([key(0)], True) == [None]
    flood(tier, 0, 1)  # stored again: no mark
    flood(tier, 100, 20)
    assert in_bucket(reader, [0]) == []


def test_expiry_wins_over_keep(open_object: Opener) -> None:
    tier = open_object(capacity=10_000, tenants=RULES, expire="1s")
    flood(tier, 0, 2)
    assert tier.keep([key(0), key(1)], True) == [True, True]
    time.sleep(1.2)
    assert tier.get([key(0)]) == [None]
    assert tier.keep([key(1)], True) == [None]  # expired: a miss, deleted, mark gone
    stats = dict(tier.stats())
    assert (stats["kept_blocks"], stats["tenant_expired.default"]) == (0, 2)


def test_a_block_another_writer_stored_is_kept_and_counted(open_object: Opener) -> None:
    tier = open_object(capacity=10_000, tenants=RULES)
    other = open_object(capacity=10_000)
    reader = open_object()
    flood(other, 0, 1)  # not in tier's index until its next LIST
    assert tier.keep([key(0)], True) == [True]
    flood(tier, 100, 20)
    assert in_bucket(reader, [0]) == [0]
    assert dict(tier.stats())["kept_bytes"] == 1000


def test_without_a_capacity_nothing_evicts_and_held_blocks_answer_true(
        open_object: Opener) -> None:
    tier = open_object(tenants=RULES)
    flood(tier, 0, 1)
    assert tier.keep([key(0), key(1)], True) == [True, None]
    assert tier.keep([key(0), key(1)], False) == [True, None]
    assert dict(tier.stats())["kept_blocks"] == 0
