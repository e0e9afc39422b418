"""Eviction policies of the tiers that evict: every policy's name, and one built by name.

The fixed policies (``lru``, ``arc``, ``s3fifo``) are in
:mod:`kvtier.backends.fixed_policies`, and ``adaptive``, which follows
whichever of them hits most, in :mod:`kvtier.backends.adaptive`; both are
re-exported here.  This module sits above the two so that each is imported
when a module loads, with no cycle between them.
"""

from __future__ import annotations

from typing import TypeAlias

from .adaptive import Adaptive
from .fixed_policies import FIXED_POLICIES, Accounting, Arc, Lru, S3Fifo, Sized, stand_in

__all__ = ["EVICTION_POLICIES", "FIXED_POLICIES", "Accounting", "Adaptive", "Arc", "Lru", "Policy",
           "S3Fifo", "Sized", "new_policy", "stand_in"]

EVICTION_POLICIES = ("lru", "arc", "s3fifo", "adaptive")

Policy: TypeAlias = Lru | Arc | S3Fifo | Adaptive


def new_policy(eviction: str, capacity: int) -> Policy:
    """The accounting object of one ``eviction`` policy, without a backend around it.

    ``kvtier plan`` replays traces through it on a null data path (payloads
    that only have a length), so its curves come from the tier's own code.
    It offers ``holds(keys)``, ``access(key)`` (a use; the payload or None),
    ``admit(key, data, evicted)`` for a key not held, ``remove(key)``, and
    ``evictions``; callers serialise their calls.
    """
    if eviction == "adaptive":
        return Adaptive(capacity)
    return FIXED_POLICIES[eviction](capacity)
