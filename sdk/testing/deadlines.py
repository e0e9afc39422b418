"""Group ``deadlines``: ``kvtier_deadlines`` says how long blocks' deadlines have left
(contract 1.4).

The answers: per key the seconds left before the block's deadline
(``kvtier_expire``), or None for a key not stored, a block without a deadline
and one past it.  A second, later deadline leaves the earlier one.  The kit
waits real time once: a deadline of a fraction of a second (the ``expire``
group's), and allows the same slack around the seconds it reads back.
"""

from __future__ import annotations

import time

import pytest

from .base import KitBase, kit_group
from .data import block_for, key_of
from .expire import DEADLINE_S

__all__ = ["DeadlinesTests"]

#: A deadline the kit reads back long before it passes, in seconds.
LONG_S = 60.0
#: How far an answer may sit above the seconds given (clocks read at two instants).
SLACK_S = 0.05


@kit_group("deadlines")
class DeadlinesTests(KitBase):
    """Runs for backends that implement ``kvtier_deadlines``."""

    def _deadline_given(self, keys: list[bytes], after: float) -> None:
        answer = self.store.handle.expire(keys, after)
        if answer != [True] * len(keys):
            pytest.skip(f"backend {self.backend!r} did not take a deadline ({answer!r}) with "
                        "these options")

    def _deadline_left(self, key: bytes, after: float, since: float) -> float:
        """The seconds ``key`` has left, checked against ``after`` given at ``since``."""
        [left] = self.store.handle.deadlines([key])  # checks the answer: None or above 0
        elapsed = time.monotonic() - since
        assert left is not None, (
            f"kvtier_deadlines answered None for a block given a deadline {after} s away")
        assert after - elapsed - SLACK_S <= left <= after + SLACK_S, (
            f"kvtier_deadlines answered {left} s for a deadline {after} s away, "
            f"{elapsed:.3f} s ago")
        return left

    def test_seconds_left_and_none_where_there_is_no_deadline(self) -> None:
        due, other, absent = (key_of("deadlines", 0), key_of("deadlines-other", 0),
                              key_of("deadlines-absent", 0))
        blocks = [block_for(due, 4096), block_for(other, 4096)]
        assert self.store.put([due, other], blocks) == [True, True]
        assert self.store.handle.deadlines([]) == []
        assert self.store.handle.deadlines([due, other, absent]) == [None, None, None], (
            "no deadline was given: every answer must be None")
        since = time.monotonic()
        self._deadline_given([due], LONG_S)
        self._deadline_left(due, LONG_S, since)
        answer = self.store.handle.deadlines([other, absent, due])
        assert answer[:2] == [None, None], (
            f"a block without a deadline and a key never stored answered {answer[:2]!r}")
        assert self.store.get([due, other]) == blocks, "asking changes no block"

    def test_the_earlier_of_two_deadlines(self) -> None:
        key = key_of("deadlines-twice", 0)
        assert self.store.put([key], [block_for(key, 4096)]) == [True]
        self._deadline_given([key], LONG_S)
        since = time.monotonic()
        self._deadline_given([key], LONG_S / 2)
        self._deadline_given([key], LONG_S * 60)  # later: the earlier stays
        self._deadline_left(key, LONG_S / 2, since)

    def test_none_once_the_deadline_passed(self) -> None:
        key = key_of("deadlines-past", 0)
        assert self.store.put([key], [block_for(key, 4096)]) == [True]
        self._deadline_given([key], DEADLINE_S)
        start = time.monotonic()  # the deadline is no later than start + DEADLINE_S
        time.sleep(max(0.0, start + DEADLINE_S - time.monotonic()) + 0.05)
        assert self.store.handle.deadlines([key]) == [None], (
            "a block past its deadline is a miss: kvtier_deadlines must answer None")
