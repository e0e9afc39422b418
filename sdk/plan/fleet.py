"""A fleet: N engines, each with its own RAM and local tier, sharing one pool tier.

A router sends each request of the trace to one engine:

* ``round-robin``: request ``r`` goes to engine ``r mod N``;
* ``sticky``: a request's session id, where the trace has one, else its first
  block's key, picks the engine: CRC-32 of its decimal text, ``mod N``, so a
  conversation (whose first block never changes) stays on one engine;
* ``prefix``: the engine whose own tiers (RAM and local, not the shared pool)
  hold the longest leading run of the request's blocks, as a prefix-aware
  router picks; ties go to the engine that has served fewest requests, then
  to the lowest index.  Holding is checked with ``peek``: routing is no use.

Affinity alone can send every request to one engine: on a trace whose
requests all begin with the same system-prompt block, both ``sticky``
(keyed by that block) and ``prefix`` do.  ``balance`` bounds the load as
consistent hashing with bounded loads does (Mirrokni, Thorup and
Zadimoghaddam, SODA 2018): when request ``r`` (from 0) is routed, an engine
that has served ``ceil(balance * (r + 1) / N)`` requests is full; ``sticky``
then takes the next engine after its own (``i + 1 mod N``, ...) with room,
and ``prefix`` picks among the engines with room.  ``0`` sets no bound.

On its engine a request runs as a chain runs it (and as
:func:`kvtier.plan.below.replay_below` does for one engine): its cached
prefix is the leading blocks found walking RAM, then local, then the pool;
a block found below RAM is promoted into every tier above the one that held
it.  The rest of the request is put into RAM.  With ``write: through`` what a
tier stores (not a promotion) is written to the tier below it at once; with
``write: back`` the blocks a tier evicts are written to the tier below it.
A block already held by the tier written to is no write.  RAM evicts with the
chosen policy; local and pool tiers with ``below_eviction``: ``lru`` (the fs
tier's default) or ``s3fifo`` (the fs and object tiers' ``eviction: s3fifo``).
Capacities are in blocks of one size; a capacity of 0 leaves that tier out.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass, fields
from typing import Any

from kvtier.policies import new_policy

from .below import BELOW_EVICTIONS
from .curves import BLOCK_SCALE
from .trace import Request, Trace

__all__ = ["ROUTERS", "EngineServed", "FleetPoint", "replay_fleet", "sticky_engine"]

ROUTERS = ("round-robin", "sticky", "prefix")

_RAM, _LOCAL, _POOL = 0, 1, 2


@dataclass(frozen=True)
class EngineServed:
    """What one engine's requests found, and what it wrote below RAM."""

    requests: int
    references: int
    from_ram: int  # prefix blocks its RAM served
    from_local: int  # prefix blocks its local tier served
    from_pool: int  # prefix blocks the shared pool served it
    prefix_tokens: int  # prompt tokens in its cached prefixes: prefill saved
    written_local: int  # blocks written into its local tier
    written_pool: int  # blocks it wrote into the shared pool
    #: Of those writes, the ones no read used before the block left the tier (or the
    #: trace ended): what an admission rule could refuse without losing a hit there.
    never_read_local: int = 0
    never_read_pool: int = 0  # of its writes to the pool, read by no engine

    @property
    def prefix_hits(self) -> int:
        return self.from_ram + self.from_local + self.from_pool

    @property
    def prefix_ratio(self) -> float:
        return self.prefix_hits / self.references if self.references else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "prefix_hits": self.prefix_hits,
                "prefix_ratio": self.prefix_ratio}


@dataclass(frozen=True)
class FleetPoint:
    """One replay of a trace across a fleet; capacities in blocks, per engine but the pool's."""

    engines: int
    router: str
    eviction: str  # RAM's policy
    ram: int
    local: int
    pool: int
    write: str
    balance: float
    per_engine: tuple[EngineServed, ...]
    below_eviction: str = "lru"  # the local and pool tiers' policy

    @property
    def total(self) -> EngineServed:
        return EngineServed(*(sum(getattr(e, f.name) for e in self.per_engine)
                              for f in fields(EngineServed)))

    def to_json(self) -> dict[str, Any]:
        head = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "per_engine"}
        return {**head, "total": self.total.to_json(),
                "per_engine": [e.to_json() for e in self.per_engine]}


def sticky_engine(request: Request, engines: int) -> int:
    """The engine the sticky router sends ``request`` to."""
    anchor = request.session if request.session is not None else (
        request.keys[0] if request.keys else "")
    return zlib.crc32(str(anchor).encode()) % engines


class _Engine:
    """One engine's tiers (the pool shared with the others) and its counters."""

    __slots__ = ("counts", "index", "own", "roles", "tiers")

    def __init__(self, index: int, tiers: list[Any], roles: list[int]) -> None:
        self.index = index
        self.tiers = tiers
        self.roles = roles  # _RAM, _LOCAL or _POOL, per tier
        self.own = [t.size for t, role in zip(tiers, roles, strict=True) if role != _POOL]
        # requests, references, from ram/local/pool, tokens, written local/pool,
        # never read local/pool
        self.counts = [0] * 10

    def holds(self, key: int) -> bool:
        """Whether its own tiers hold ``key`` (not a use: nothing moves)."""
        return any(size(key) is not None for size in self.own)


def _route(router: str, engines: list[_Engine], r: int, request: Request,
           balance: float) -> _Engine:
    n = len(engines)
    if router == "round-robin":
        return engines[r % n]
    # r + 1: never reached; a balance of n or more never binds, so it is computed as n
    full = math.ceil(min(balance, n) * (r + 1) / n) if balance else r + 1
    if router == "sticky":
        first = sticky_engine(request, n)
        return next(e for i in range(n) if (e := engines[(first + i) % n]).counts[0] < full)
    longest = [e for e in engines if e.counts[0] < full]  # holding the longest prefix so far
    for key in request.keys:
        still = [e for e in longest if e.holds(key)]
        if not still:
            break
        longest = still
    return min(longest, key=lambda e: (e.counts[0], e.index))


def replay_fleet(
    trace: Trace, engines: int, router: str = "round-robin", eviction: str = "lru",
    ram: int = 1, local: int = 0, pool: int = 0, write: str = "through", balance: float = 0.0,
    below_eviction: str = "lru",
) -> FleetPoint:
    """Replay ``trace`` across ``engines`` engines sharing a pool of ``pool`` blocks."""
    if engines < 1 or ram < 1 or local < 0 or pool < 0:
        raise ValueError("a fleet needs at least one engine and RAM of at least one block")
    if not math.isfinite(balance) or (balance and balance < 1):
        raise ValueError(f"balance is 0 (no bound) or at least 1, not {balance}")
    if router not in ROUTERS:
        raise ValueError(f"unknown router {router!r}: {', '.join(ROUTERS)}")
    if write not in ("back", "through"):
        raise ValueError(f"write is back or through, not {write!r}")
    if below_eviction not in BELOW_EVICTIONS:
        raise ValueError(f"local and pool tiers evict {' or '.join(BELOW_EVICTIONS)}, "
                         f"not {below_eviction!r}")
    shared = new_policy(below_eviction, pool * BLOCK_SCALE) if pool else None
    fleet: list[_Engine] = []
    for _ in range(engines):
        tiers: list[Any] = [new_policy(eviction, ram * BLOCK_SCALE)]
        roles = [_RAM]
        if local:
            tiers.append(new_policy(below_eviction, local * BLOCK_SCALE))
            roles.append(_LOCAL)
        if shared is not None:
            tiers.append(shared)
            roles.append(_POOL)
        fleet.append(_Engine(len(fleet), tiers, roles))
    back = write == "back"
    # per block held by a local tier or the pool: the engine that wrote it, and whether
    # a read used it since (keyed by the tier: the pool's is one for every engine)
    unread: dict[int, dict[int, tuple[_Engine, bool]]] = {
        id(tier): {} for engine in fleet for tier in engine.tiers[1:]}

    def gone(tier: Any, victims: list[Any], role: int) -> None:
        held = unread[id(tier)]
        for victim in victims:
            writer, read = held.pop(victim)
            if not read:
                writer.counts[7 + role] += 1  # never read local (8) or pool (9)

    def store(engine: _Engine, i: int, key: int, promoted: bool, absent: bool = False) -> None:
        tiers = engine.tiers
        # ``absent``: the walk just missed it there, and a second miss is a use to
        # ``adaptive``'s miniatures, where plan's replay makes one
        if not absent and tiers[i].access(key):
            return
        victims = tiers[i].admit(key, BLOCK_SCALE)
        if i:
            engine.counts[5 + engine.roles[i]] += 1  # written local (6) or pool (7)
            gone(tiers[i], victims, engine.roles[i])
            unread[id(tiers[i])][key] = (engine, False)
        if i + 1 < len(tiers):
            if back:
                for victim in victims:
                    store(engine, i + 1, victim, False)
            elif not promoted:  # promotions go no further down: they came from there
                store(engine, i + 1, key, False)

    for r, request in enumerate(trace.requests):
        engine = _route(router, fleet, r, request, balance)
        tiers, roles, counts = engine.tiers, engine.roles, engine.counts
        keys = request.keys
        if eviction == "adaptive":  # the lookup: adaptive learns where requests begin
            tiers[0].holds(keys)
        counts[0] += 1
        counts[1] += len(keys)
        prefix = 0
        for key, weight in zip(keys, request.tokens, strict=True):
            for i in range(len(tiers)):
                if tiers[i].access(key):
                    break
            else:
                break
            counts[2 + roles[i]] += 1
            counts[5] += weight
            if i:
                held = unread[id(tiers[i])]
                held[key] = (held[key][0], True)
            for above in range(i):  # promoted into every tier above, as the chain does
                store(engine, above, key, True, True)
            prefix += 1
        for j in range(prefix, len(keys)):
            store(engine, 0, keys[j], False, j == prefix)
    for engine in fleet:  # what each tier below RAM still holds unread at the end
        for tier, role in zip(engine.tiers[1:], engine.roles[1:], strict=True):
            for writer, read in unread.pop(id(tier), {}).values():  # the pool's: once
                writer.counts[7 + role] += not read
    served = tuple(EngineServed(*e.counts) for e in fleet)
    return FleetPoint(engines, router, eviction, ram, local, pool, write, balance, served,
                      below_eviction)
