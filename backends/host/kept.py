"""Kept blocks of a host store: retention marks, their budget, and victims spared.

A kept block stays in the store's eviction policy, in its order, so that
every policy (and :class:`~kvtier.policies.Partitioned`'s quotas and fair
share) keeps counting its bytes.  When the policy picks a kept block as a
victim, the store puts it back (``enter``) and asks the policy for more room
(``shed``), until the room is made of blocks not kept.  Where only kept
blocks are left to give room, the put that needed it is refused: a kept
block is never a victim (:func:`spare`).

Marks are bounded per tenant by its rule's ``keep`` (the retention budget,
:class:`~kvtier.policies.tenancy.TenantRule`), and all tenants' together by
the capacity, so kept blocks cannot fill the tier.  An expired block still
expires, kept or not, and an explicit evict removes it: the store forgets
its mark then (:meth:`KeptMarks.forget`).

The store's lock guards every call here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from kvtier.policies import Policy
from kvtier.policies.sparing import spare_kept

__all__ = ["KeptMarks", "spare"]


class KeptMarks:
    """Which blocks of a store are kept, their bytes per tenant, and the refusals."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        #: Full key (the namespace's prefix and the key) -> its size when marked.
        self.sizes: dict[bytes, int] = {}
        self._tenant: dict[bytes, str] = {}
        self.by_tenant: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        #: Victims the policy chose that were kept and put back: not evictions.
        self.spared = 0

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def used(self) -> int:
        return sum(self.by_tenant.values())

    def mark(self, key: bytes, size: int, tenant: str, budget: int) -> bool:
        """Keep ``key`` (held, ``size`` bytes) unless that passes ``tenant``'s ``budget``
        or the capacity; a key already kept is kept."""
        if key in self.sizes:
            return True
        if (self.by_tenant[tenant] + size > budget
                or self.used + size > self.capacity):
            self.refused[tenant] += 1
            return False
        self.sizes[key] = size
        self._tenant[key] = tenant
        self.by_tenant[tenant] += size
        return True

    def forget(self, key: bytes) -> None:
        """``key`` is no longer kept: released, expired, evicted by request, or gone."""
        size = self.sizes.pop(key, None)
        if size is not None:
            self.by_tenant[self._tenant.pop(key)] -= size


def spare(policy: Policy, marks: KeptMarks, victims: list[bytes],
          new: Callable[[], object]) -> tuple[list[bytes], bool]:
    """``victims`` less the kept ones, which go back into ``policy``; the room they gave
    is taken again from blocks not kept (``policy.shed``; the loop is
    :func:`~kvtier.policies.sparing.spare_kept`).

    Where every block the policy offers is kept, the block being put is taken out again
    (``new()``) and the answer says so: ``(victims, False)``.  Before the put, kept
    blocks fitted the policy's bounds, so they fit again then.  The block being put
    may be among the victims (a FIFO's newest): the caller refuses it then.
    """
    gone, spared, placed = spare_kept(victims, marks.sizes,
                                      lambda v: policy.enter(v, marks.sizes[v]), policy.shed)
    marks.spared += spared
    if not placed:
        new()
        gone += _spared_shed(policy, marks)
    return gone, placed


def _spared_shed(policy: Policy, marks: KeptMarks) -> list[bytes]:
    """What is left over the bounds once the new block is out: blocks not kept only
    (there are none in the usual case), the kept ones put back."""
    gone: list[bytes] = []
    for _ in range(len(marks.sizes) + 1):
        victims = policy.shed()
        if not victims:
            break
        for victim in victims:
            if victim in marks.sizes:
                policy.enter(victim, marks.sizes[victim])
                marks.spared += 1
            else:
                gone.append(victim)
    return gone
