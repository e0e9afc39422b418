"""What ``kvtier serve`` answers per key: a GET's blobs, an EVICT's, KEEP's, EXPIRE's flags,
DEADLINES' seconds left.

Each works on the chain of the connection's namespace, the one its handshake
named, so a request can reach no other namespace's blocks, and no other
tenant's: a tenant is a namespace apart (docs/tenants.md).  The server's
tiers count every namespace as the tenant ``default`` (they are not told the
client's tenant), so a KEEP is bounded by the ``keep`` budget of their
``default`` rule (else ``"*"``'s).
"""

from __future__ import annotations

from kvtier.chain.chain import Chain
from kvtier.chain.expiring import deadlines_left, expire_tiers, per_key
from kvtier.chain.keeping import mark
from kvtier.peer import protocol as pp
from kvtier.spec import BytesLike

__all__ = ["deadlines", "evict", "expire", "get", "keep"]


def get(rid: int, chain: Chain, keys: list[bytes], limit: int) -> list[BytesLike]:
    """A GET's reply as a gather list: the frame head, then the blobs found that fit."""
    sizes: list[int | None] = []
    parts: list[BytesLike] = []
    total = 0
    for blob in chain.get_blobs(keys):
        if blob is None:
            sizes.append(None)
            continue
        size = memoryview(blob).nbytes
        if size > limit:
            sizes.append(None)  # can never travel to this client: a miss
        elif total + size > limit:
            sizes.append(pp.RETRY)  # the client asks for it in its next request
        else:
            sizes.append(size)
            parts.append(blob)
            total += size
    return [pp.frame({"t": pp.REPLY, "id": rid, "s": sizes}, total), *parts]


def evict(chain: Chain, keys: list[bytes]) -> list[bool]:
    """Per key, whether some tier removed it."""
    # Chain.evict answers a count; the protocol answers per key, so do what it
    # does (finish queued writes, then evict from every tier) keeping the flags.
    chain.flush()
    removed = [False] * len(keys)
    for tier in chain.tiers:
        for i, flag in enumerate(tier.evict(keys)):
            removed[i] = removed[i] or flag
    return removed


def keep(chain: Chain, keys: list[bytes], marked: bool) -> list[bool | None]:
    """Mark (``marked``) or release ``keys`` at every tier that keeps marks, as
    ``kvtier_keep`` answers: per key False where a tier refused the mark, True where
    one kept (released) it, None where no tier that keeps marks holds it."""
    if marked:
        chain.flush()  # queued copies land first, as Chain.keep does
    return per_key(len(keys), (mark(tier, keys, marked) for tier in chain.tiers))


def expire(chain: Chain, keys: list[bytes], after: float) -> list[bool | None]:
    """Give ``keys`` a deadline ``after`` seconds from now at every tier, as
    ``kvtier_expire`` answers: per key False where a tier that holds it refused
    the deadline or holds none (no ``kvtier_expire``: it outlives the deadline
    there), True where one set it, None where no tier holds it.  The server's chain
    remembers it, as Chain.expire's does, so the copies it makes take it along."""
    chain.flush()  # queued copies land first, as Chain.expire does
    return expire_tiers(chain, keys, after)


def deadlines(chain: Chain, keys: list[bytes]) -> list[float | None]:
    """The deadlines left of ``keys`` as the server's chain sees them: per key the
    earliest deadline among its tiers that hold one (``kvtier_deadlines``), in seconds,
    None where none does.  Asking is no use of a block, and no change to it."""
    return deadlines_left(chain, keys)
