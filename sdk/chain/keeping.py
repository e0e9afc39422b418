"""Retention marks through a chain: :meth:`Chain.keep <kvtier.chain.Chain.keep>` and
:meth:`Chain.release <kvtier.chain.Chain.release>` (deadlines, the other half of
retention: :mod:`.expiring`).

A **kept** block is no eviction victim at a tier while marked: the tier's
capacity and its tenant's quota evict other blocks, and a put that could only
fit by evicting kept blocks is refused.  Marks are made at every tier that
holds the block and implements ``kvtier_keep`` (contract 1.2, ``host`` and
``fs``); a tier without the hook keeps nothing and is skipped.  They are
bounded per tenant by the tier's ``tenants`` rule ``keep`` (the retention
budget): a block beyond it is refused, False, and counted in the tier's
``keep_refused``.  A kept block still expires (``expire`` wins), and
:meth:`~kvtier.chain.Chain.evict` removes it.  The name is not LMCache's:
its adapter's lock pins are another thing (docs/tenants.md, "Retention").

Copies still queued for tiers below land first, so the tiers they go to hold
the blocks when they are marked.  A copy made later is not kept where it
lands, and need not be: a kept block is no capacity victim, so it is never
demoted, and a promotion's source keeps its mark (a deadline does move with
its block: :mod:`.carry`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvtier.chain.arguments import check_keys
from kvtier.chain.expiring import Deadlines, per_key
from kvtier.chain.tier import Tier

__all__ = ["Retention", "mark"]


class _Chain(Protocol):
    tiers: list[Tier]

    def _check_open(self) -> None: ...

    def flush(self, timeout: float | None = None) -> bool: ...


def mark(tier: Tier, keys: Sequence[bytes], keep: bool) -> list[bool | None]:
    """``kvtier_keep`` at ``tier``: per key True, False (refused for the budget), or
    None (not held there, or the tier keeps nothing, or it is unavailable)."""
    if not keys or not tier.handle.implements("kvtier_keep"):
        return [None] * len(keys)
    answer = tier._call("keep", lambda: tier.handle.keep(keys, keep), len(keys))
    if answer is None:
        return [None] * len(keys)
    refused = sum(1 for a in answer if a is False)
    if refused:
        tier.stats.add(keep_refused=refused)
    return list(answer)


class Retention(Deadlines):
    """The chain's retention calls (a mixin of :class:`~kvtier.chain.Chain`): keep and
    release here, expire from :class:`~kvtier.chain.expiring.Deadlines`."""

    def keep(self: _Chain, keys: Sequence[bytes]) -> list[bool]:
        """Mark ``keys``' blocks kept at every tier that holds them and keeps marks.

        Per key, True where some tier kept it and none refused it; False where no
        tier holds it, none keeps marks, or a tier refused it for its tenant's
        retention budget (counted in that tier's ``keep_refused``).  Marks last
        until :meth:`release`, an expiry, or an evict.
        """
        self._check_open()
        keys = check_keys(keys)
        self.flush()  # queued copies land first: the tiers below hold them when marked
        answers = per_key(len(keys), (mark(tier, keys, True) for tier in self.tiers))
        return [a is True for a in answers]

    def release(self: _Chain, keys: Sequence[bytes]) -> list[bool]:
        """Release the marks of ``keys``' blocks at every tier: they may be evicted again.

        Per key, True where some tier that keeps marks holds the block (marked or not).
        """
        self._check_open()
        keys = check_keys(keys)
        answers = per_key(len(keys), (mark(tier, keys, False) for tier in self.tiers))
        return [a is True for a in answers]  # a release answers True or None
