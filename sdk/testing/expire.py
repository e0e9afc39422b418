"""Group ``expire``: ``kvtier_expire`` gives blocks a deadline, a miss once past (contract 1.3).

The answers: per key True (the block now expires by then), False (refused)
or None (not stored).  Before the deadline the block reads back exact; once
it is past, a get and a lookup miss, while a block given none still reads
back exact.  A second, later deadline does not put off the first.  The kit
waits real time: deadlines of a fraction of a second.
"""

from __future__ import annotations

import time

import pytest

from .base import KitBase, kit_group
from .data import block_for, key_of

__all__ = ["ExpireTests"]

#: The deadline the kit gives, in seconds: long enough for a get before it.
DEADLINE_S = 0.4


@kit_group("expire")
class ExpireTests(KitBase):
    """Runs for backends that implement ``kvtier_expire``."""

    def _expire(self, keys: list[bytes], after: float) -> list[bool | None]:
        answer = self.store.handle.expire(keys, after)  # checks the batch's length
        for flag in answer:
            assert flag is None or isinstance(flag, bool), (
                f"backend {self.backend!r}: kvtier_expire answered {flag!r}: expected "
                "True, False or None")
        return answer

    def _past(self, start: float, after: float) -> None:
        time.sleep(max(0.0, start + after - time.monotonic()) + 0.05)

    def test_a_block_past_its_deadline_is_a_miss(self) -> None:
        due, other, absent = (key_of("expire", 0), key_of("expire-other", 0),
                              key_of("expire-absent", 0))
        data, other_data = block_for(due, 4096), block_for(other, 4096)
        assert self.store.put([due, other], [data, other_data]) == [True, True]
        assert self._expire([], DEADLINE_S) == []
        asked = time.monotonic()
        answer = self._expire([due, absent], DEADLINE_S)
        start = time.monotonic()  # the deadline is no later than start + DEADLINE_S
        assert answer[1] is None, f"kvtier_expire of a key never stored answered {answer[1]!r}"
        if answer[0] is False:
            pytest.skip(f"backend {self.backend!r} refused a deadline (False) with these "
                        "options")
        assert answer[0] is True, answer
        if time.monotonic() - asked < DEADLINE_S / 2:  # a slow call leaves no time to read
            assert self.store.get([due]) == [data], "before its deadline a block reads exact"
        self._past(start, DEADLINE_S)
        assert self.store.get([due]) == [None], "a block past its deadline must be a miss"
        assert self.store.lookup([due]) == [False], "a lookup past the deadline must miss"
        assert self.store.get([other]) == [other_data], (
            "a block given no deadline must stay, byte for byte")

    def test_a_later_deadline_does_not_put_off_an_earlier_one(self) -> None:
        key = key_of("expire-twice", 0)
        assert self.store.put([key], [block_for(key, 4096)]) == [True]
        if self._expire([key], DEADLINE_S) != [True]:
            pytest.skip(f"backend {self.backend!r} refused a deadline with these options")
        start = time.monotonic()
        assert self._expire([key], 3600.0) == [True]
        self._past(start, DEADLINE_S)
        assert self.store.get([key]) == [None], (
            "a second, later deadline put off the first: the earlier one holds")
