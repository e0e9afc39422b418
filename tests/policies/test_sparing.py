"""The victims a tier spares because they are kept (kvtier.policies.sparing), over a real Lru."""

from __future__ import annotations

from kvtier.policies import Lru
from kvtier.policies.sparing import spare_kept


def lru_of(keys: list[bytes], capacity: int) -> Lru:
    lru = Lru(capacity)
    for key in keys:
        lru.enter(key, 1)
    return lru


def test_kept_victims_go_back_and_the_room_comes_from_the_others() -> None:
    lru = lru_of([b"a", b"b", b"c", b"d"], 4)
    kept = {b"a": 1, b"b": 1}
    lru.enter(b"e", 1)  # one over: the oldest (kept) is offered first
    gone, spared, placed = spare_kept(lru.shed(), kept, lambda k: lru.enter(k, kept[k]),
                                      lru.shed)
    assert (gone, placed) == ([b"c"], True)
    assert spared == 2  # a and b offered, put back
    assert sorted(key for key, _ in lru.held()) == [b"a", b"b", b"d", b"e"]


def test_only_kept_blocks_left_says_the_room_was_not_made() -> None:
    lru = lru_of([b"a", b"b"], 1)  # over its bound by one, every block kept
    kept = {b"a": 1, b"b": 1}
    gone, spared, placed = spare_kept(lru.shed(), kept, lambda k: lru.enter(k, kept[k]),
                                      lru.shed)
    assert (gone, placed) == ([], False)
    assert spared == 3  # a, b, then a again: every kept block offered in a row
    assert sorted(key for key, _ in lru.held()) == [b"a", b"b"]


def test_nothing_kept_answers_the_victims_as_they_are() -> None:
    assert spare_kept([b"x"], {}, lambda k: None, list) == ([b"x"], 0, True)
    assert spare_kept([], {b"x": 1}, lambda k: None, list) == ([], 0, True)
