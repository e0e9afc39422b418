"""Victims spared: a kept block (``kvtier_keep``) is never a victim of a tier's eviction order.

A tier that keeps blocks leaves them in its order (a :class:`~kvtier.policies.Policy`,
or the ``object`` tier's index), so that every bound keeps counting their
bytes.  When the order picks a kept block, the tier puts it back and asks
the order for the room again, until the room is made of blocks not kept:
:func:`spare_kept`, the loop the host and object tiers share
(``backends/host/kept.py``, ``backends/object/kept.py``); what each does
where only kept blocks are left stays its own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

__all__ = ["spare_kept"]


def spare_kept(victims: list[bytes], kept: Collection[bytes], put_back: Callable[[bytes], None],
               more: Callable[[], list[bytes]]) -> tuple[list[bytes], int, bool]:
    """``victims`` less the ``kept`` ones, each given to ``put_back``, and the room they gave
    taken again from the victims ``more()`` offers next.

    Answers the victims not kept, how many were put back, and whether the room
    was made: False where every kept block was offered in a row, so that only
    kept blocks are left to give it (the caller takes the block being put out
    again).
    """
    if not kept or not victims:
        return victims, 0, True
    gone: list[bytes] = []
    spared = 0
    kept_in_a_row = 0  # victims offered in a row that were all kept
    while victims:
        back = [v for v in victims if v in kept]
        gone += [v for v in victims if v not in kept]
        if not back:
            break
        for victim in back:
            put_back(victim)
        spared += len(back)
        kept_in_a_row = kept_in_a_row + len(back) if len(back) == len(victims) else len(back)
        if kept_in_a_row > len(kept):  # every kept block offered: no other is left
            return gone, spared, False
        victims = more()
    return gone, spared, True
