"""A RAM tier over one tier below, replayed with the chain's admission (``admit``, and sample).

Each request makes the calls an engine makes: a lookup of all its blocks,
a get of the cached prefix, a put of the rest.  Each call is noted in the
chain's own admission (:class:`kvtier.policies.admission.Admission`: its sketch
of counts, and its keys' lineages where a sample is asked for).  A prefix block
found below is read from there and promoted into RAM; blocks RAM evicts go
below (``write: back``) if admitted, or blocks RAM stores go below at once
(``write: through``) if admitted.  The tier below evicts with
``below_eviction``: ``lru`` (the fs tier's default) or ``s3fifo`` (the fs
and object tiers' ``eviction: s3fifo``, the same
:class:`kvtier.policies.S3Fifo`).  Capacities are in blocks of one
size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtier.policies import new_policy, supported
from kvtier.policies.admission import Admission

from .curves import BLOCK_SCALE
from .trace import Trace

__all__ = ["BELOW_EVICTIONS", "BelowPoint", "replay_below"]

#: The policies of the tiers below RAM: the fs tier's (its pool writes these two in
#: SQL); the object tier's fifo is not among them.
BELOW_EVICTIONS = supported("lru", "s3fifo")


def _key_bytes(key: int) -> bytes:
    """The bytes a trace's key stands for in the chain's sketch."""
    return (key & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little")


@dataclass(frozen=True)
class BelowPoint:
    ram: int
    below: int
    write: str
    admit: int
    references: int
    from_ram: int  # prefix blocks RAM served
    from_below: int  # prefix blocks the tier below served
    written_below: int  # blocks written to the tier below
    below_eviction: str = "lru"  # the tier below's policy
    #: Writes below that no read used before the block left the tier (or the trace
    #: ended): what an admission rule could refuse without losing a hit below.
    never_read: int = 0
    admit_sample: float = 0.0  # the share of lineages written at first sight besides

    @property
    def admission(self) -> str:
        """The tier's admission as its YAML says it: ``3``, or ``3, sample 0.3``."""
        sample = f", sample {self.admit_sample:g}" if self.admit_sample else ""
        return f"{self.admit}{sample}"

    @property
    def never_read_share(self) -> float:
        return self.never_read / self.written_below if self.written_below else 0.0

    @property
    def prefix_ratio(self) -> float:
        return (self.from_ram + self.from_below) / self.references if self.references else 0.0


def replay_below(
    trace: Trace, eviction: str, ram: int, below: int, write: str = "back", admit: int = 1,
    below_eviction: str = "lru", admit_sample: float = 0.0,
) -> BelowPoint:
    """Replay ``trace`` through RAM (``eviction``, ``ram`` blocks) over a tier of ``below``."""
    if below_eviction not in BELOW_EVICTIONS:
        raise ValueError(f"the tier below evicts {' or '.join(BELOW_EVICTIONS)}, "
                         f"not {below_eviction!r}")
    top: Any = new_policy(eviction, ram * BLOCK_SCALE)
    low: Any = new_policy(below_eviction, below * BLOCK_SCALE)
    admission = Admission([1, admit], [0.0, admit_sample if admit > 1 else 0.0])  # the chain's
    read_below: dict[int, bool] = {}  # each block below: read since its write
    from_ram = from_below = written = never_read = 0

    def write_below(keys: list[int]) -> None:
        nonlocal written, never_read
        for key in keys:
            if admit > 1 and not admission.admitted(1, [_key_bytes(key)])[0][0]:
                continue
            if not low.access(key):  # a key held below keeps its block: no write
                dropped = low.admit(key, BLOCK_SCALE)  # what the tier below evicts
                written += 1
                read_below[key] = False
                for gone in dropped:
                    never_read += not read_below.pop(gone)

    def store(key: int, promoted: bool = False) -> None:
        if top.access(key):
            return
        evicted = top.admit(key, BLOCK_SCALE)
        if write == "through" and not promoted:  # promotions go no further down
            write_below([key])
        elif write == "back" and evicted:
            write_below(evicted)

    lookup = top.holds if eviction == "adaptive" else None  # adaptive learns where requests begin
    for request in trace.requests:
        keys = list(request.keys)
        as_bytes = [_key_bytes(k) for k in keys]
        admission.note(as_bytes)  # the lookup
        if lookup is not None:
            lookup(keys)
        prefix = 0
        for key in keys:
            if top.access(key):
                from_ram += 1
            elif low.access(key):
                from_below += 1
                read_below[key] = True
                store(key, promoted=True)
            else:
                break
            prefix += 1
        if prefix:
            admission.note(as_bytes[:prefix])  # the get
        if prefix < len(keys):
            admission.note(as_bytes[prefix:])  # the put
            for key in keys[prefix:]:
                store(key)
    never_read += sum(not read for read in read_below.values())
    return BelowPoint(ram, below, write, admit, trace.references, from_ram, from_below, written,
                      below_eviction, never_read, admit_sample if admit > 1 else 0.0)
