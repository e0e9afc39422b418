"""The expiry clock: which keys expire after their write, or unused, at a given time."""

from __future__ import annotations

from kvtier.policies.expiry import ExpiryClock
from kvtier.policies.tenancy import Expiry


def test_after_counts_from_the_write_whatever_the_uses() -> None:
    clock: ExpiryClock[bytes] = ExpiryClock(Expiry(after=10))
    clock.wrote(b"a", 0), clock.wrote(b"b", 5)
    clock.used(b"a", 9)
    assert not clock.expired(b"a", 9.9) and clock.expired(b"a", 10)
    assert clock.due(12) == [b"a"] and clock.due(12) == []  # due forgets what it returns
    assert clock.due(15) == [b"b"] and len(clock) == 0


def test_unused_counts_from_the_last_use() -> None:
    clock: ExpiryClock[bytes] = ExpiryClock(Expiry(unused=10))
    clock.wrote(b"a", 0), clock.wrote(b"b", 1)
    clock.used(b"a", 8)
    assert clock.due(12) == [b"b"]
    assert not clock.expired(b"a", 17) and clock.expired(b"a", 18)
    clock.forget(b"a")
    assert clock.due(100) == [] and not clock.expired(b"a", 100)


def test_both_expire_whichever_comes_first() -> None:
    clock: ExpiryClock[bytes] = ExpiryClock(Expiry(after=100, unused=10))
    clock.wrote(b"a", 0)
    for t in range(5, 100, 5):
        clock.used(b"a", t)  # never unused for 10s, but written 100s ago at t=100
    assert clock.due(99) == [] and clock.due(100) == [b"a"]
