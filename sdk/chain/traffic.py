"""The chain's writes between tiers: through, demotion, promotion, and RAM tiers saved at close.

A :class:`~kvtier.chain.chain.Chain` owns one :class:`Traffic`.  The chain's
walk serves callers' reads and writes; every write, the walk's and the
traffic's own, is settled here (:meth:`Traffic.settle`), which sends
copies down (or, for promotions, up) on per-tier worker threads, bounded
by a per-tier backlog in bytes so a slow tier slows writers down instead
of filling memory.  Blocks on their way down stay readable from
:attr:`Traffic.queued`.  Every copy takes its block's deadline along
(:mod:`kvtier.chain.carry`, :attr:`Traffic.deadlines`).

Imports the queue's parts (:mod:`kvtier.chain.queue`) and tiers, never the
chain: the walk calls the traffic, not the other way round.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from kvtier.block import framing
from kvtier.block.framing import Checked, Codec, Header
from kvtier.chain.carry import DeadlineRecord, Times, asks, carry, held_anywhere, learn
from kvtier.chain.queue import Backlog, DemotionSink, Pending, Queued
from kvtier.chain.tier import Evicted, Tier
from kvtier.policies.admission import Admission
from kvtier.spec import BytesLike, CorruptBlockError

__all__ = ["DEFAULT_BACKLOG_BYTES", "Emit", "Traffic", "Unsaved", "WriteKind"]

log = logging.getLogger("kvtier.chain")

#: Bytes of asynchronous writes that may wait for one tier before writers block.
DEFAULT_BACKLOG_BYTES = 256 << 20

#: Why blocks are written to a tier: a caller's put, or the chain's own traffic.
WriteKind = Literal["put", "through", "demote", "promote"]
#: How the traffic tells the chain's listeners: ``(kind, tier index, keys, reason)``.
Emit = Callable[[Literal["stored", "removed"], int, Iterable[bytes], str], None]


class Unsaved:
    """Per tier: keys it holds that the write-back tier below has not got
    yet, for tiers that lose their blocks at close (RAM).  Close saves
    them below, so write-back costs no block a write-through would keep.
    """

    def __init__(self, keep: Iterable[bool]) -> None:  # per tier: whether it keeps any
        self._held: list[set[bytes] | None] = [set() if k else None for k in keep]
        self._lock = threading.Lock()

    def mark(self, index: int, keys: Iterable[bytes], unsaved: bool) -> None:
        held = self._held[index]
        if held is None:
            return
        with self._lock:
            if unsaved:
                held.update(keys)
            else:
                held.difference_update(keys)

    def take(self, index: int) -> list[bytes]:
        """The keys tier ``index`` has unsaved, forgotten here as they are handed out."""
        held = self._held[index]
        if not held:
            return []
        with self._lock:
            keys = list(held)
            held.clear()
        return keys


class Traffic:
    """The asynchronous writes between the tiers of one chain."""

    def __init__(
        self, tiers: Sequence[Tier], backlog_bytes: int, emit: Emit
    ) -> None:
        self.tiers = tiers
        self._emit = emit
        # what the tiers below let in (admit, admit_sample): the chain notes each call here
        self.admission = Admission([t.config.admit for t in tiers],
                                   [t.config.admit_sample for t in tiers])
        self._writers = [
            ThreadPoolExecutor(t.config.workers, thread_name_prefix=f"kvtier-{t.name}")
            for t in self.tiers
        ]
        self._backlogs = [Backlog(backlog_bytes) for _ in self.tiers]
        self.pending = Pending()
        self.queued = Queued()  # blocks on their way down: readable meanwhile
        self.unsaved = Unsaved(self._keeps_unsaved(i) for i in range(len(self.tiers)))
        self.deadlines = DeadlineRecord()  # the chain's, so that copies take them along

    def writes_through(self, index: int) -> bool:
        """Whether what tier ``index`` stores is written through to the tier below."""
        return index + 1 < len(self.tiers) and self.tiers[index + 1].config.write == "through"

    def _writes_back(self, index: int) -> bool:
        return index + 1 < len(self.tiers) and self.tiers[index + 1].config.write == "back"

    def _keeps_unsaved(self, index: int) -> bool:
        return self._writes_back(index) and not self.tiers[index].capabilities.persistent

    def storing(self, keys: Sequence[bytes]) -> None:
        """A caller's put of ``keys``, before it stores: a key whose block left every tier
        starts without a deadline (:meth:`DeadlineRecord.stored_again`)."""
        if self.deadlines:  # none set: nothing to forget (the common case)
            self.deadlines.stored_again(
                keys, functools.partial(held_anywhere, self.tiers, self.queued))

    # settling writes --------------------------------------------------------------
    def settle(
        self,
        index: int,
        keys: Sequence[bytes],
        flags: Sequence[bool],
        evicted: Evicted,
        kind: WriteKind,
        frame_below: Callable[[int], BytesLike],
        *,
        verify: bool,
    ) -> None:
        """Settle a finished write into tier ``index``: every write's results go here.

        Marks what a RAM tier must save below at close, sends capacity
        victims down, tells listeners, and writes what was stored through
        to the tier below when its policy asks (``frame_below(j)`` is the
        frame for ``keys[j]``; ``verify``: whether the tier below checks its
        checksum, see :meth:`Tier.put_blobs`).  Promoted copies go no further
        down: they came from there.  A caller's put of a block still held with a
        deadline (:meth:`storing` kept it) gives it that deadline here too.
        """
        if kind == "put" and self.deadlines:  # none set: nothing to give (the common case)
            known = self.deadlines.known(keys)
            if known is not None:
                flags = carry(self.tiers[index], keys, flags, known)
        stored = [j for j, flag in enumerate(flags) if flag]
        if kind != "promote":
            self.unsaved.mark(index, (keys[j] for j in stored), True)
        self._handle_evicted(index, evicted)
        self._emit("stored", index, (keys[j] for j in stored), kind)
        if stored and kind != "promote" and self.writes_through(index):
            stored = self._admitted(index + 1, keys, stored)
            if stored:
                self.submit(
                    index + 1, [keys[j] for j in stored], [frame_below(j) for j in stored],
                    "through", verify=verify,
                )

    def _admitted(self, index: int, keys: Sequence[bytes], offered: Iterable[int]) -> list[int]:
        """Of ``keys[j]`` for ``j`` in ``offered``, those tier ``index``'s ``admit`` lets in."""
        offered = list(offered)
        flags, by_sample = self.admission.admitted(index, [keys[j] for j in offered])
        kept = [j for j, flag in zip(offered, flags) if flag]
        if len(kept) < len(offered) or by_sample:
            self.tiers[index].stats.add(not_admitted=len(offered) - len(kept),
                                        sample_admitted=by_sample)
        return kept

    def evicted_sink(self, index: int) -> Evicted:
        """The list a put into tier ``index`` reports its capacity victims in."""
        return DemotionSink(self.queued, index + 1) if self._writes_back(index) else []

    def _handle_evicted(self, index: int, evicted: Evicted) -> None:
        if not evicted:
            return
        self.unsaved.mark(index, (k for k, _ in evicted), False)
        if self._writes_back(index):
            self.queued.add(index + 1, evicted)
            keys = [k for k, _ in evicted]
            kept = self._admitted(index + 1, keys, range(len(keys)))
            if len(kept) < len(keys):  # no longer on their way down: gone from the chain
                left = set(kept)
                out = [evicted[j] for j in range(len(keys)) if j not in left]
                self.queued.landed(index + 1, [k for k, _ in out], [b for _, b in out])
            if kept:
                self.submit(index + 1, [keys[j] for j in kept],
                            [evicted[j][1] for j in kept], "demote")
        self._emit("removed", index, (k for k, _ in evicted), "capacity")

    # promotion --------------------------------------------------------------------
    def promote(
        self,
        source: int,
        keys: Sequence[bytes],
        frames: Sequence[Checked],
        payloads: Sequence[BytesLike] | None = None,
    ) -> None:
        """Copy hits of tier ``source`` up into the tiers above that take promotions.

        A tier that stores a frame as it is (the same codec) gets the frame as
        it was read: no new header, no second checksum pass, and one copy at
        most (none where the read gave ``bytes``).  A frame read without
        verification keeps the checksum it was read with, so a tier above
        that verifies still checks it when it reads it.  A tier with another
        codec gets a frame encoded from the read's checked ``payloads``, or
        re-encoded from the frame, which its put checks first.
        """
        targets = [
            i for i in range(source) if self.tiers[i].config.promote and self.tiers[i].healthy
        ]
        if not keys or not targets:
            return
        owned: list[BytesLike | None] = [None] * len(keys)
        made: dict[Codec, tuple[list[BytesLike], list[Header | None]]] = {}
        for index in targets:
            codec = self.tiers[index].codec
            if codec not in made:
                made[codec] = self._frames_for(codec, source, keys, frames, owned, payloads)
            blobs, headers = made[codec]
            self.submit(index, list(keys), blobs, "promote", verify=False, headers=headers,
                        source=source)

    def _frames_for(
        self,
        codec: Codec,
        source: int,
        keys: Sequence[bytes],
        frames: Sequence[Checked],
        owned: list[BytesLike | None],
        payloads: Sequence[BytesLike] | None,
    ) -> tuple[list[BytesLike], list[Header | None]]:
        """Promoted frames for a tier of ``codec``, with their headers where known;
        ``owned`` caches each read frame, copied out of the caller's buffer once."""
        ns = self.tiers[source].namespace.fingerprint
        blobs: list[BytesLike] = []
        headers: list[Header | None] = []
        for j, frame in enumerate(frames):
            # a sealed frame read into a caller's buffer was opened there: made afresh
            fresh = frame.header.key_id or not framing.kept_as(frame.header, codec)
            if payloads is not None and frame.verified and fresh:
                blobs.append(framing.encode(ns, keys[j], payloads[j], codec))
                headers.append(None)
                continue
            own = owned[j]
            if own is None:
                parts = frame.parts
                one = parts[0] if len(parts) == 1 else None
                own = owned[j] = one if isinstance(one, bytes) else b"".join(parts)
            if frame.header.key_id and not framing.kept_as(frame.header, codec):
                # a sealed frame the tier above cannot keep: opened with the keys of
                # the tier it came from (the tier above may have none), sealed anew
                with contextlib.suppress(CorruptBlockError):  # else refused above, and counted
                    payload = framing.decode(own, ns, keys[j], header=frame.header,
                                             seal=self.tiers[source].seal).payload
                    own = framing.encode(ns, keys[j], payload, codec)
            blobs.append(own)
            headers.append(frame.header if own is owned[j] else None)
        return blobs, headers

    # the writers ------------------------------------------------------------------
    def submit(
        self,
        index: int,
        keys: list[bytes],
        blobs: list[BytesLike],
        kind: WriteKind,
        *,
        verify: bool = True,
        headers: Sequence[Header | None] = (),
        source: int | None = None,
    ) -> bool:
        """Queue framed blocks for tier ``index``; promotions never wait for room.

        A block written through stays readable from the queue until it lands,
        like a demotion: the tier above may evict it before then.  ``verify``
        and ``headers`` (each frame's, parsed already) go to :meth:`Tier.put_blobs`.
        The copies take the deadlines the chain knows now along, and those of
        the tier they come from (``source``, a promotion's; a write-through's
        is the tier above), asked when they are written.
        """
        nbytes = sum(memoryview(b).nbytes for b in blobs)
        if not self._backlogs[index].acquire(nbytes, block=kind != "promote"):
            self.tiers[index].stats.add(dropped=len(keys))
            return False
        if kind == "through":
            self.queued.add(index, zip(keys, blobs))
            source = index - 1
        known = self.deadlines.known(keys)  # learned now: it may pass while queued
        self.pending.start()
        try:
            self._writers[index].submit(
                self._write, index, keys, blobs, kind, verify, headers, nbytes, known, source
            )
        except RuntimeError:  # executor shut down: the chain is closing
            self._write_done(index, keys, blobs, nbytes)
            return False
        return True

    def _write(
        self,
        index: int,
        keys: list[bytes],
        blobs: list[BytesLike],
        kind: WriteKind,
        verify: bool,
        headers: Sequence[Header | None],
        nbytes: int,
        known: Times | None,
        source: int | None,
    ) -> None:
        tier = self.tiers[index]
        try:
            if source is not None and asks(self.deadlines, self.tiers[source]):
                known = learn(self.tiers[source], keys, known)  # before: it still holds them
            flags, evicted = tier.put_blobs(
                keys, blobs, self.evicted_sink(index), verify=verify, headers=headers
            )
            if known is not None:
                flags = carry(tier, keys, flags, known)
            stored = sum(flags)
            if kind == "demote":
                tier.stats.add(demoted=stored)
            elif kind == "promote":
                tier.stats.add(promoted=stored)
            if stored < len(flags) and not tier.healthy:
                tier.stats.add(dropped=len(flags) - stored)
            self.settle(index, keys, flags, evicted, kind, blobs.__getitem__, verify=verify)
        except Exception:  # a bug here must not kill the worker silently
            log.exception("kvtier: asynchronous %s write to tier %r failed", kind, tier.name)
        finally:
            self._write_done(index, keys, blobs, nbytes)

    def _write_done(
        self, index: int, keys: list[bytes], blobs: list[BytesLike], nbytes: int
    ) -> None:
        self.queued.landed(index, keys, blobs)
        self._backlogs[index].release(nbytes)
        self.pending.done()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued asynchronous write (through, demotion, promotion) is done."""
        return self.pending.wait(timeout)

    # closing ----------------------------------------------------------------------
    def save_unsaved(self) -> None:
        """At close: copy what RAM tiers hold and their write-back tiers lack down to them.

        Top down, so a block saved into a tier that is itself unsaved moves on.
        """
        for index in range(len(self.tiers)):
            keys = self.unsaved.take(index)
            if not keys:
                continue
            below = self.tiers[index + 1]
            for start in range(0, len(keys), 64):  # bounded memory: 64 blobs at a time
                part = keys[start : start + 64]
                found = self.tiers[index].get_blobs(part)
                pairs = [(k, b) for k, b in zip(part, found) if b is not None]
                if not pairs:
                    continue
                saving = [k for k, _ in pairs]
                known = self._known(index, saving)
                flags, evicted = below.put_blobs(
                    saving, [b for _, b in pairs], self.evicted_sink(index + 1)
                )
                if known is not None:
                    flags = carry(below, saving, flags, known)
                self._handle_evicted(index + 1, evicted)
                saved = [k for (k, _), flag in zip(pairs, flags) if flag]
                below.stats.add(demoted=len(saved))
                self.unsaved.mark(index + 1, saved, True)

    def _known(self, source: int, keys: Sequence[bytes]) -> Times | None:
        """The deadlines of ``keys`` the chain knows and tier ``source`` answers."""
        known = self.deadlines.known(keys)
        if asks(self.deadlines, self.tiers[source]):
            known = learn(self.tiers[source], keys, known)
        return known

    def shutdown(self) -> None:
        """Stop the writers once what they run has finished."""
        for writer in self._writers:
            writer.shutdown(wait=True)
