"""Deadlines (``kvtier_expire``) on the ``object`` tier, against a real S3 server (SeaweedFS):
a block past its deadline is a miss for the instance that set it, and its object is deleted
from the bucket, so another instance misses it too; the tier's own ``expire`` still holds."""

from __future__ import annotations

import time
from functools import partial

import pytest
from object_blocks import Blocks, Opener, blob

NS = "e" * 32
BLOCKS = Blocks(b"due")
key, exact = BLOCKS.key, BLOCKS.exact


@pytest.fixture
def open_object(open_object: Opener) -> Opener:
    """The conftest's opener, in this module's namespace."""
    return partial(open_object, NS)


def test_a_block_past_its_deadline_is_a_miss_here_and_gone_from_the_bucket(
        open_object: Opener) -> None:
    mine, other = open_object(), open_object()
    ids = [0, 1, 2]
    assert mine.put([key(i) for i in ids], [blob(i) for i in ids], []) == [True] * 3
    before = time.monotonic()
    assert mine.expire([key(0), key(2), key(9)], 1.0) == [True, True, None]
    start = time.monotonic()  # the deadline is no later than start + after
    assert exact(other, ids) == ids or time.monotonic() - before > 1.0
    time.sleep(max(0.0, start + 1.0 - time.monotonic()))
    assert exact(mine, ids) == [1]  # this instance: a miss at once
    assert mine.lookup([key(0), key(2)]) == [False, False]
    deadline = time.monotonic() + 5
    while exact(other, ids) != [1]:  # deleted by the instance's thread, for every reader
        assert time.monotonic() < deadline, "the objects past their deadline stayed"
        time.sleep(0.05)
    assert dict(mine.stats())["expired"] == 2


def test_a_later_deadline_does_not_put_off_an_earlier_one_nor_the_tier_s_expire(
        open_object: Opener) -> None:
    t = open_object(expire="3s")
    ids = [0, 1, 2]
    assert t.put([key(i) for i in ids], [blob(i) for i in ids], []) == [True] * 3
    assert t.expire([key(0)], 0.6) == [True]
    start = time.monotonic()  # the deadline is no later than start + after
    assert t.expire([key(0)], 3600) == [True]  # the earlier stays
    assert t.expire([key(1)], 3600) == [True]  # never past the tier's own expire
    time.sleep(max(0.0, start + 0.8 - time.monotonic()))
    assert exact(t, ids) == [1, 2]
    time.sleep(max(0.0, start + 3.3 - time.monotonic()))
    assert exact(t, ids) == []


def test_a_block_stored_again_after_its_deadline_has_none(open_object: Opener) -> None:
    t = open_object()
    assert t.put([key(5)], [blob(5)], []) == [True]
    assert t.expire([key(5)], 0.4) == [True]
    time.sleep(0.5)
    assert exact(t, [5]) == []
    deadline = time.monotonic() + 5
    while t.lookup([key(5)]) != [False] or time.monotonic() < deadline - 4.5:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert t.put([key(5)], [blob(5)], []) == [True]
    time.sleep(0.5)
    assert exact(t, [5]) == [5]
