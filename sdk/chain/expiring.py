"""Deadlines through a chain: :meth:`Chain.expire <kvtier.chain.Chain.expire>`.

A tier's ``expire`` (YAML) is the operator's bound: a block expires ``after``
a time from its write, or ``unused`` for a time.  A caller who knows a block
is worth less (a one-off prompt, a session about to end) gives it a
**deadline** of its own: ``chain.expire(keys, after="10m")``.  A deadline
only brings expiry forward, never past the tier's own ``expire``: the block
expires at its deadline or when the tier says, whichever is first, so the
operator's bound always holds, and a second, later deadline changes nothing
(the earlier stays).  An expired block is what any expired block is: a miss
at once, its bytes freed, counted in the tier's ``expired``.  A kept block
(:meth:`~kvtier.chain.Chain.keep`) still expires at its deadline.

Deadlines are set at every tier that holds the block and implements
``kvtier_expire`` (contract 1.3: ``host``, ``fs``, ``object``, ``redis``,
``peer``).  A tier that holds the block without the hook keeps it by its own
``expire`` alone, so ``expire`` answers False for that key: the caller knows the block
may outlive the deadline there, and may evict it.  As with :meth:`~kvtier.chain.Chain.keep`,
copies still queued for tiers below land first.  A copy made later (a
promotion, a demotion, a write-through) takes the deadline along where it
lands (:mod:`.carry`): the chain remembers the deadlines it set, and asks
the tier a promotion comes from for those other processes set there
(``kvtier_deadlines``, contract 1.4).

vLLM requests give their blocks a deadline with the ``kv_hints`` action
``kvtier.expire`` (:mod:`kvtier.contrib.vllm.hints`).  How each backend
holds a deadline, and for how many processes: docs/tenants.md, "Expiry".
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Protocol

from kvtier.chain.arguments import check_keys
from kvtier.chain.tier import Tier
from kvtier.chain.traffic import Traffic
from kvtier.plugins.options import parse_duration
from kvtier.spec import earliest_deadlines

__all__ = ["Deadlines", "deadline_seconds", "deadlines_left", "expire_tiers", "per_key",
           "set_deadline"]


class _Chain(Protocol):
    tiers: list[Tier]
    _traffic: Traffic

    def _check_open(self) -> None: ...

    def flush(self, timeout: float | None = None) -> bool: ...


def deadline_seconds(after: float | str) -> float:
    """``after`` (seconds, or a duration such as ``"10m"``) as seconds above 0; a
    ``ValueError`` says what is wrong."""
    seconds = parse_duration(after)
    if seconds <= 0:
        raise ValueError(f"a deadline is a time above 0 from now, got {after!r}")
    return seconds


def set_deadline(tier: Tier, keys: Sequence[bytes], after: float) -> list[bool | None]:
    """``kvtier_expire`` at ``tier``: per key True (set), False (refused, or held by a
    tier without the hook), or None (not held there, or the tier is unavailable)."""
    if not keys:
        return []
    if not tier.handle.implements("kvtier_expire"):
        held = tier.lookup(keys)  # held there, it outlives the deadline at that tier
        return [False if h else None for h in held]
    answer = tier._call("expire", lambda: tier.handle.expire(keys, after), len(keys))
    return [None] * len(keys) if answer is None else list(answer)


def deadlines_left(chain: _Chain, keys: Sequence[bytes]) -> list[float | None]:
    """Per key, the seconds left before the earliest deadline a tier of ``chain`` holds
    for the block (``kvtier_deadlines``), as that hook answers for the chain as a whole:
    None where no tier that answers holds one."""
    out: list[float | None] = [None] * len(keys)
    for tier in chain.tiers:
        if keys and tier.handle.implements("kvtier_deadlines"):
            earliest_deadlines(out, _left(tier, keys) or ())
    return out


def _left(tier: Tier, keys: Sequence[bytes]) -> list[float | None] | None:
    return tier._call("deadlines", lambda: tier.handle.deadlines(keys), len(keys))


def per_key(count: int, tiers_answers: Iterable[Sequence[bool | None]]) -> list[bool | None]:
    """The tiers' per-key answers (a keep, an expire) joined: False where any tier said
    False, else True where one said True, else None (no tier holds the block)."""
    out: list[bool | None] = [None] * count
    for answers in tiers_answers:
        for i, answer in enumerate(answers):
            if answer is False or (answer is True and out[i] is None):
                out[i] = answer
    return out


def expire_tiers(chain: _Chain, keys: Sequence[bytes], after: float) -> list[bool | None]:
    """``kvtier_expire`` at each of ``chain``'s tiers, answers joined (:func:`per_key`), and
    remembered by the chain for the copies it makes later (:mod:`.carry`).  The caller
    flushes first, so that queued copies land at the tiers below before."""
    at = time.monotonic() + after
    record = chain._traffic.deadlines
    record.remember(keys, at)  # first: a copy queued meanwhile takes it along
    answers = per_key(len(keys), (set_deadline(tier, keys, after) for tier in chain.tiers))
    record.forget([k for k, a in zip(keys, answers, strict=True) if a is None], at)
    return answers


class Deadlines:
    """The chain's deadline call (a mixin of :class:`~kvtier.chain.Chain`)."""

    def expire(self: _Chain, keys: Sequence[bytes], after: float | str) -> list[bool]:
        """Give ``keys``' blocks a deadline ``after`` (seconds, or ``"10m"``) from now.

        Per key, True where some tier holds the block and every tier that holds
        it will have dropped it by then (sooner where its own ``expire`` says);
        False where no tier holds it, or one that does holds no deadlines
        (no ``kvtier_expire``) or refused it.  A ``ValueError`` for an ``after``
        that is no time above 0.
        """
        self._check_open()
        keys = check_keys(keys)
        seconds = deadline_seconds(after)
        self.flush()  # queued copies land first: the tiers below hold them when set
        return [a is True for a in expire_tiers(self, keys, seconds)]
