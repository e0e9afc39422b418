"""Every eviction policy's name, written once, and one built by name.

:data:`NAMES` is the list a tier's ``eviction`` option checks against;
:func:`supported` is how a backend declares the subset it offers (the fs
pool writes only ``lru`` and ``s3fifo`` in SQL), so a name misspelt there, or
a policy renamed here, fails when the backend is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .adaptive import Adaptive
from .arc import Arc
from .base import Policy
from .lru import Lru
from .s3fifo import S3Fifo

__all__ = ["NAMES", "POLICIES", "new_policy", "supported"]

#: Every policy by its name, in the order they are listed to users.
POLICIES: Mapping[str, Callable[[int], Policy]] = {
    policy.name: policy for policy in (Lru, Arc, S3Fifo, Adaptive)
}
#: The valid values of a tier's ``eviction`` option.
NAMES: tuple[str, ...] = tuple(POLICIES)


def new_policy(eviction: str, capacity: int) -> Policy:
    """A new policy named ``eviction``, of ``capacity`` bytes, holding nothing.

    ``kvtier plan`` replays traces through it on a null data path, so its
    curves come from the tiers' own code.  An unknown name is a ``KeyError``
    (options check the name against :data:`NAMES` first).
    """
    return POLICIES[eviction](capacity)


def supported(*names: str) -> tuple[str, ...]:
    """``names``, each checked to be a registered policy: a backend's declaration of
    the policies it offers (its ``eviction`` option's choices)."""
    unknown = [name for name in names if name not in POLICIES]
    if unknown:
        raise ValueError(f"not eviction policies: {', '.join(unknown)} (known: "
                         f"{', '.join(NAMES)})")
    return names
