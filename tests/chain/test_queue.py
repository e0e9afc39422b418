"""The chain's queue of blocks on their way down (``kvtier.chain.queue``)."""

from __future__ import annotations

from kvtier.chain.queue import Queued


def test_queue_keeps_the_first_of_a_repeated_key() -> None:
    # the contract: within one batch the first occurrence of a key is the one
    # stored, so a read served from the queue must answer that one too
    queued = Queued()
    first, later = b"first frame", b"a later frame of other bytes"
    queued.add(1, [(b"k", first), (b"other", b"o"), (b"k", later)])
    assert queued.snapshot([b"k", b"other"]) == {b"k": (1, first), b"other": (1, b"o")}
    assert queued.find(b"k", {}) == (1, first)


def test_queue_forgets_a_repeated_key_once_its_write_landed() -> None:
    queued = Queued()
    first, later = b"first", b"later"
    queued.add(2, [(b"k", first), (b"k", later)])
    queued.landed(2, [b"k", b"k"], [first, later])
    assert queued.snapshot([b"k"]) == {}

