"""One tier of a chain: a backend behind the block format, health and stats.

A :class:`Tier` turns the backend's opaque blocks into checked payloads:
it frames what it writes (:mod:`kvtier.block.framing`), checks what it reads,
counts everything, and turns backend faults into misses while the backend
is unhealthy.  It never raises a backend's fault to its caller.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from kvtier.block import framing
from kvtier.block.crypt import keyring_from
from kvtier.block.framing import Codec
from kvtier.block.namespace import Namespace
from kvtier.chain.arguments import runs_of
from kvtier.chain.health import Health, Reopen, close_quietly
from kvtier.chain.scatter import ScatterReads, landed_header
from kvtier.observe.stats import TierStats
from kvtier.plugins.options import with_values
from kvtier.plugins.registry import BackendHandle
from kvtier.spec import (
    BackendError,
    BytesLike,
    Capabilities,
    ClosedError,
    ConfigError,
    ContractError,
    CorruptBlockError,
    ScanEntry,
)

if TYPE_CHECKING:
    from kvtier.config.chain_config import TierConfig

__all__ = ["Evicted", "Tier"]

log = logging.getLogger("kvtier.chain.tier")

Evicted = list[tuple[bytes, BytesLike]]
T = TypeVar("T")
#: Bytes per get_into call to an in-process backend, see :meth:`Tier._cache_sized`.
_CACHE_BATCH = 4 << 20


class Tier:
    """A backend instance wrapped for use in a chain."""

    def __init__(self, config: TierConfig, handle: BackendHandle, namespace: Namespace) -> None:
        self.config = config
        self.name = config.name
        self.handle = handle
        self.namespace = namespace
        self._ns = namespace.fingerprint
        shuffle = config.shuffle
        width = namespace.shuffle_width() if shuffle == "auto" else int(shuffle)
        # frames name the tenant; a tier with encrypt seals them (kvtier.block.crypt)
        self.seal = keyring_from(config.encrypt, f"{config.path or 'chain'}.encrypt")
        self.codec = Codec(config.codec, config.codec_level, width if width > 1 else 0,
                           namespace.tenant.encode(), self.seal)
        self.verify = config.verify
        self.stats = TierStats()
        # Two breakers: a failed store (disk full, quota) must not take the
        # tier's reads down with it, while an unreachable tier fails both.
        self.health = Health()
        self.write_health = Health()
        self.capabilities = Capabilities()
        self._serial: threading.Lock | None = None
        self._sizes_logged: set[tuple[int, int]] = set()  # see _wrong_size
        self._in_process = False
        self._closed = False
        self._reopen: Reopen | None = None  # set while the backend has not opened
        self._open_lock = threading.Lock()  # installing a late-opened backend, or closing
        self._scatter = ScatterReads(self.name)  # large direct reads, checked run by run

    # lifecycle ----------------------------------------------------------------
    def open(self, retry: Callable[[], BackendHandle] | None = None,
             opened: Callable[[], None] | None = None) -> None:
        """Open the backend, then call ``opened``.

        A :class:`~kvtier.spec.ConfigError` raises.  So does any other fault,
        unless ``retry`` makes fresh backends (a chain's tier) and the tier is
        not ``required``: then the tier starts failed and is opened again
        later (:class:`~kvtier.chain.health.Reopen`, which calls ``opened``).
        """
        try:
            self.handle.open(self.options_for(self.handle), self.namespace.hex)
        except ConfigError as exc:
            raise self._config_error(exc) from exc
        except Exception as exc:
            if retry is None or self.config.required:
                raise
            self._reopen = Reopen(self, exc, retry, opened)
            self._reopen.start()
            return
        self._install(self.handle)
        if opened is not None:
            opened()

    def options_for(self, handle: BackendHandle) -> Mapping[str, Any]:
        """The tier's options, and the namespace's tenant where the backend counts tenants."""
        tenant = {"tenant": self.namespace.tenant} if "tenant" in handle.options() else {}
        return with_values(self.config.options, **tenant)

    def _install(self, handle: BackendHandle) -> None:
        capabilities = handle.capabilities()
        self._in_process = not (capabilities.persistent or capabilities.shared)
        if not capabilities.thread_safe:
            # the contract promises such backends one call at a time
            self._serial = threading.Lock()
        self.capabilities = capabilities
        self.handle = handle

    def adopt(self, handle: BackendHandle) -> bool:
        """Serve from ``handle``, opened late; False where the tier closed meanwhile."""
        with self._open_lock:
            if self._closed:
                return False
            failed = self.handle
            self._install(handle)
            self._reopen = None  # last: calls see the new backend from here on
        close_quietly(failed)
        return True

    def _config_error(self, exc: ConfigError) -> ConfigError:
        """``exc`` (an option the backend refused at open) naming the tier, its entry and line."""
        config = self.config
        key = exc.key
        where = config.option_where.get(key, config.where) if key else config.where
        if key and config.path:
            key = f"{config.path}.{key}"
        return ConfigError(f"{exc.reason} (tier {self.name!r})", where=where, key=key)

    def close(self) -> None:
        with self._open_lock:
            if self._closed:
                return
            self._closed = True
            reopen, self._reopen = self._reopen, None
        self._scatter.close()  # its reads done: none lands in a caller's buffer later
        if reopen is None:
            self.handle.close()
        else:  # never opened: its close must not raise either; an attempt under way
            reopen.stop()  # closes what it opens (adopt answers False)
            close_quietly(self.handle)

    @property
    def healthy(self) -> bool:
        """Taking reads and writes; see :attr:`readable` for reads alone."""
        return self.readable and self.write_health.available()

    @property
    def readable(self) -> bool:
        return self._reopen is None and self.health.available()

    def _call(self, op: str, fn: Callable[[], T], n: int, measure: bool = False) -> T | None:
        """Run a backend call; a fault trips a breaker and answers None.

        A fault of a put trips the write breaker only: reads of what the
        tier holds go on.  Any other fault trips the read breaker, which
        stops writes too.  A ``measure`` call's fault (:mod:`.readback`) is
        counted in ``errors`` and raised to the caller, and trips no breaker.
        """
        if self._closed:
            raise ClosedError(f"tier {self.name!r} is closed")
        breaker = self.write_health if op == "put" else self.health
        if self._reopen is not None or not (breaker.available() and self.health.available()):
            return None  # not open yet, or backed off
        try:
            with self.stats.timed(op):
                if self._serial is None:
                    result = fn()
                else:
                    with self._serial:
                        result = fn()
            if not isinstance(result, Sequence) or len(result) != n:
                raise ContractError(
                    f"{op} returned {type(result).__name__} of length "
                    f"{len(result) if isinstance(result, Sequence) else '?'} for {n} keys"
                )
        except ClosedError:
            raise
        except Exception as exc:
            self.stats.add(errors=1)
            if measure:  # a measurement's, not the tier's health: no request waits on it
                raise
            backoff = breaker.fault(repr(exc))
            log.warning("tier %r (%s) failed in %s: %r; skipping its %s for %.1fs", self.name,
                        self.config.backend, op, exc, "writes" if op == "put" else "calls",
                        backoff)
            return None
        breaker.ok()
        return result

    # writes -------------------------------------------------------------------
    def put_payloads(
        self,
        keys: Sequence[bytes],
        payloads: Sequence[BytesLike],
        evicted: Evicted | None = None,
        *,
        join: bool = False,
    ) -> tuple[list[bool], Evicted, list[Sequence[BytesLike]]]:
        """Frame and store raw payloads.

        Returns the per-key result, what capacity pushed out (into
        ``evicted`` when given: the backend fills it during the call), and
        each block's frame in parts (``(header, stored payload)``, or the one
        ``bytes`` the backend was given), so a caller writing the same block
        to more tiers need not frame it again.  A stored payload may be the
        caller's buffer itself (codec ``none``).  ``join``: the caller keeps
        the frames (to write them through below), so each is joined into one
        ``bytes`` here and that object is what the backend gets: a backend
        that copies gather lists in (host) would join it a second time.
        """
        evicted = [] if evicted is None else evicted
        if not keys:
            return [], evicted, []
        parts: list[Sequence[BytesLike]]
        if self.codec.name == "none":  # checksummed or sealed when the backend reads it
            parts = [framing.lazy_frame(self._ns, k, p, self.codec) for k, p in zip(keys, payloads)]
        else:
            parts = [
                framing.encode_parts(self._ns, k, p, self.codec) for k, p in zip(keys, payloads)
            ]
        frames = list(parts)
        if self.handle.implements("kvtier_put_parts") and not join:
            result = self._call(
                "put", lambda: self.handle.put_parts(keys, parts, evicted), len(keys)
            )
        else:
            joined = [b"".join(p) for p in parts]
            frames = [(blob,) for blob in joined]
            result = self._call("put", lambda: self.handle.put(keys, joined, evicted), len(keys))
        sizes = [memoryview(p).nbytes for p in payloads]
        return self._after_put(keys, result, evicted, sizes), evicted, frames

    def put_blobs(
        self,
        keys: Sequence[bytes],
        blobs: Sequence[BytesLike],
        evicted: Evicted | None = None,
        *,
        verify: bool = True,
        headers: Sequence[framing.Header | None] = (),
    ) -> tuple[list[bool], Evicted]:
        """Store already framed blocks, re-encoding those whose codec differs from the tier's.

        ``verify``: check each payload's checksum here, where the tier's own
        ``verify`` is on.  A caller passes False for a frame this process made
        from a checked payload, one checked as it was read, or one it leaves
        to be checked when read: that frame is stored with the checksum it
        came with.  A frame re-encoded for this tier's codec is checked first
        all the same (:func:`~kvtier.block.framing.recode`).  ``headers``: the
        frames' parsed headers, where the caller has them (else each is parsed).
        """
        evicted = [] if evicted is None else evicted
        if not keys:
            return [], evicted
        verify = self.verify and verify
        ready: list[bytes] = []
        kept: list[bytes] = []
        for i, (key, blob) in enumerate(zip(keys, blobs)):
            header = headers[i] if headers else None
            try:
                ready.append(
                    framing.recode(blob, self._ns, key, self.codec, verify=verify, header=header)
                )
                kept.append(key)
            except CorruptBlockError:
                self.stats.add(corrupt=1)
        if not kept:
            return [False] * len(keys), evicted
        result = self._call("put", lambda: self.handle.put(kept, ready, evicted), len(kept))
        flags = self._after_put(kept, result, evicted, [len(b) for b in ready])
        by_key = dict(zip(kept, flags))
        return [by_key.get(k, False) for k in keys], evicted

    def _after_put(
        self,
        keys: Sequence[bytes],
        result: Sequence[bool] | None,
        evicted: Evicted,
        sizes: Sequence[int],
    ) -> list[bool]:
        if result is None:  # the put raised, or the tier's writes are backed off
            self.stats.add(failed=len(keys))
            return [False] * len(keys)
        flags = [bool(r) for r in result]
        stored = sum(flags)
        self.stats.add(
            puts=stored,
            refused=len(flags) - stored,
            bytes_in=sum(size for size, flag in zip(sizes, flags) if flag),
            evictions=len(evicted),
        )
        return flags

    # reads --------------------------------------------------------------------
    def get_into(
        self,
        keys: Sequence[bytes],
        outs: Sequence[memoryview],
        frames: list[framing.Checked | None] | None = None,
    ) -> list[bool]:
        """Fill ``outs[i]`` with the payload of ``keys[i]``; False where missing or bad.

        ``frames``: a list of ``len(keys)`` filled with each hit's frame as
        read, checked (for promotion: a frame that moves on as it is needs no
        new header and no second checksum pass).
        """
        n = len(keys)
        if not n:
            return []
        found = [False] * n
        fallback = list(range(n))
        if self._reads_direct():
            fallback = []
            for lo, hi in self._cache_sized(outs):
                sub_found = [False] * (hi - lo)
                missed = self._get_into_direct(
                    keys[lo:hi], outs[lo:hi], sub_found, frames, lo
                )
                found[lo:hi] = sub_found
                fallback.extend(lo + j for j in missed)
        if fallback:
            sub_keys = [keys[i] for i in fallback]
            blobs = self._call("get", lambda: self.handle.get(sub_keys), len(sub_keys))
            if blobs is not None:
                for i, blob in zip(fallback, blobs):
                    if blob is None:
                        continue
                    header = self._decode(keys[i], blob, outs[i], True)
                    found[i] = header is not None
                    if header is not None and frames is not None:
                        frames[i] = framing.Checked((blob,), header, self.verify)
        self._count_reads(found, outs)
        return found

    def decode(self, key: bytes, blob: BytesLike, out: memoryview, *, held: bool = True) -> bool:
        """Check ``blob`` and write its payload into ``out``; True if it was served.

        A damaged block is a miss counted in ``corrupt``, and dropped from
        the backend when ``held`` (a block from the chain's queue is not in
        it).  A sound block of another size than ``out`` is a miss counted in
        ``size_mismatch`` and kept: the reader's buffer is wrong, not the
        block, and dropping it would take it from every other reader (through
        a ``peer`` tier, from every client of the node).
        """
        return self._decode(key, blob, out, held) is not None

    def _decode(
        self, key: bytes, blob: BytesLike, out: memoryview, held: bool
    ) -> framing.Header | None:
        """:meth:`decode`, answering the block's header where it was served."""
        try:
            header = framing.parse_header(blob, self._ns, key)
            if header.raw_len != out.nbytes:
                stored = memoryview(blob).cast("B")[header.size :]
                framing.check_payload(header, stored, self.verify, self.seal)  # sound, or not
                self._wrong_size(key, header.raw_len, out.nbytes)
                return None
            framing.decode_into(blob, self._ns, key, out, verify=self.verify, header=header,
                                seal=self.seal)
            return header
        except CorruptBlockError as exc:
            self._rejected(key, exc, held)
            return None

    def decode_bytes(self, key: bytes, blob: BytesLike, *, held: bool = True) -> bytes | None:
        """Check ``blob`` and return its payload as new ``bytes``; None where damaged.

        Its header is parsed once (:func:`~kvtier.block.framing.decode`).
        """
        try:
            return framing.decode(blob, self._ns, key, verify=self.verify, seal=self.seal).payload
        except CorruptBlockError as exc:
            self._rejected(key, exc, held)
            return None

    def _rejected(self, key: bytes, exc: CorruptBlockError, held: bool) -> None:
        if held:
            self._corrupt(key, exc)
        else:
            self.stats.add(corrupt=1)

    def _reads_direct(self) -> bool:
        """Whether reads scatter blocks straight into the caller's buffers.

        So they do wherever the codec allows, except from a backend in this
        process while :mod:`~kvtier.block.framing` checks as it copies: such
        a backend's ``get`` hands out the bytes it holds (the host backend's
        does), and the one copy into the caller's buffer takes the checksum
        on the way (BENCHMARKS.md, "Figures behind design choices").
        """
        if not self.handle.implements("kvtier_get_into") or self.codec.name != "none":
            return False
        return not (self._in_process and framing.checks_while_copying())

    def _cache_sized(self, outs: Sequence[memoryview]) -> list[tuple[int, int]]:
        """Runs of a batch for one ``get_into`` call each: ``[lo, hi)`` index pairs.

        A backend in this process (neither persistent nor shared: RAM)
        fills the buffers at memory speed, and the checksum pass that follows
        would read a large batch back from memory rather than from the CPU
        cache (such reads come here only where the C extension is not built,
        see :meth:`_reads_direct`).  Calls of about :data:`_CACHE_BATCH`
        bytes keep what the checksum reads in the cache (BENCHMARKS.md,
        "Figures behind design choices").  Other backends get the whole
        batch in one call: they work on it in parallel.
        """
        if not self._in_process:
            return [(0, len(outs))]
        return runs_of([o.nbytes for o in outs], _CACHE_BATCH)

    def _get_into_direct(
        self,
        keys: Sequence[bytes],
        outs: Sequence[memoryview],
        found: list[bool],
        frames: list[framing.Checked | None] | None,
        first: int,
    ) -> list[int]:
        """Scatter-read uncompressed blocks straight into ``outs``, each checked as its
        run lands (:mod:`kvtier.chain.scatter`); return what needs get().

        Each hit's frame goes to ``frames[first + i]`` when given, as its
        header and the caller's buffer.
        """
        # [header, out], and a sealed block's tag after the header in its buffer
        made = [framing.scatter_for(self._ns, k, o, self.codec) for k, o in zip(keys, outs)]
        heads, scatter = [h for h, _ in made], [s for _, s in made]
        fallback: list[int] = []

        def landed(i: int, size: int | None) -> None:
            if size is None:
                return
            try:
                header = landed_header(self._ns, keys[i], heads[i], outs[i], size, self.verify,
                                       self.seal)
            except CorruptBlockError as exc:
                self._corrupt(keys[i], exc)
                return
            if header is None:  # compressed, of another size, foreign or damaged: read whole
                fallback.append(i)
                return
            found[i] = True
            if frames is not None:
                frames[first + i] = framing.Checked((heads[i], outs[i]), header, self.verify)

        self._scatter.read(
            lambda k, s: self._call("get", lambda: self.handle.get_into(k, s), len(k)),
            keys, scatter, [o.nbytes for o in outs], landed,
            whole=self._in_process or self._serial is not None)
        return sorted(fallback)

    def get_payloads(
        self, keys: Sequence[bytes], frames: list[framing.Checked | None] | None = None
    ) -> list[bytes | None]:
        """Payloads of unknown size as new ``bytes``; ``frames`` as for :meth:`get_into`."""
        if not keys:
            return []
        blobs = self._call("get", lambda: self.handle.get(keys), len(keys))
        out: list[bytes | None] = []
        for i, (key, blob) in enumerate(zip(keys, blobs or [None] * len(keys))):
            payload: bytes | None = None
            if blob is not None:
                try:
                    payload, header = framing.decode(blob, self._ns, key, verify=self.verify,
                                                     seal=self.seal)
                    if frames is not None:
                        frames[i] = framing.Checked((blob,), header, self.verify)
                except CorruptBlockError as exc:
                    self._corrupt(key, exc)
            out.append(payload)
        self._count_reads([p is not None for p in out], [memoryview(p or b"") for p in out])
        return out

    def get_blobs(
        self,
        keys: Sequence[bytes],
        *,
        counted: bool = False,
        frames: list[framing.Checked | None] | None = None,
        measure: bool = False,
    ) -> list[BytesLike | None]:
        """Framed blocks as stored, header checked (for moving between tiers).

        ``counted``: count hits, misses and payload bytes served, as the
        other reads do; moving blocks between tiers is not a read.
        ``frames`` as for :meth:`get_into`; ``measure`` as for :meth:`_call`.
        """
        if not keys:
            return []
        blobs = self._call("get", lambda: self.handle.get(keys), len(keys), measure)
        out: list[BytesLike | None] = [None] * len(keys)
        served = 0
        for i, (key, blob) in enumerate(zip(keys, blobs or ())):
            if blob is None:
                continue
            try:
                header = framing.parse_header(blob, self._ns, key)
                framing.check_payload(
                    header, memoryview(blob).cast("B")[header.size :], self.verify, self.seal
                )
            except CorruptBlockError as exc:
                self._corrupt(key, exc)
                continue
            out[i] = blob
            served += header.raw_len
            if frames is not None:
                frames[i] = framing.Checked((blob,), header, self.verify)
        if counted:
            hits = sum(b is not None for b in out)
            self.stats.add(hits=hits, misses=len(out) - hits, bytes_out=served)
        return out

    def _corrupt(self, key: bytes, exc: Exception) -> None:
        self.stats.add(corrupt=1)
        log.warning("tier %r: block %s rejected and dropped: %s", self.name, key.hex()[:16], exc)
        # Dropped, or lookups would go on answering "held here" for a block
        # every read rejects, and a new copy of the key would be skipped as
        # already stored.  Best effort: a failure only trips the breaker.
        self._call("evict", lambda: self.handle.evict([key]), 1)

    def _wrong_size(self, key: bytes, held: int, expected: int) -> None:
        self.stats.add(size_mismatch=1)
        with self.health.lock:  # logged once per pair of sizes, and for 64 pairs at most
            first = (held, expected) not in self._sizes_logged and len(self._sizes_logged) < 64
            if first:
                self._sizes_logged.add((held, expected))
        if first:
            log.warning(
                "tier %r: block %s holds %d bytes, the reader's buffer has %d; a miss, and the "
                "block is kept (counted in size_mismatch; reads of these sizes are not logged "
                "again)", self.name, key.hex()[:16], held, expected,
            )

    def _count_reads(self, found: list[bool], outs: Sequence[memoryview]) -> None:
        hits = sum(found)
        served = sum(o.nbytes for o, f in zip(outs, found) if f)
        self.stats.add(hits=hits, misses=len(found) - hits, bytes_out=served)

    # index --------------------------------------------------------------------
    def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        if not keys:
            return []
        result = self._call("lookup", lambda: self.handle.lookup(keys), len(keys))
        # map(bool) rather than a comprehension: lookups come by the thousand
        return [False] * len(keys) if result is None else list(map(bool, result))

    def evict(self, keys: Sequence[bytes]) -> list[bool]:
        if not keys:
            return []
        result = self._call("evict", lambda: self.handle.evict(keys), len(keys))
        if result is None:
            return [False] * len(keys)
        removed = [bool(r) for r in result]
        if any(removed):
            # room was freed: a store that failed for want of it (ENOSPC, a
            # quota) may go through now, so the next put tries at once
            self.write_health.ok()
        return removed

    def scan(self, namespace: str | None) -> Iterator[list[ScanEntry]]:
        """Batches of the blocks the store holds in ``namespace`` (``None``: every one).

        For operators' tools, off the data path: faults are raised, not
        turned into misses, and nothing is counted.  A backend without
        ``kvtier_scan`` raises :class:`~kvtier.spec.PluginError`.
        """
        if self._closed:
            raise ClosedError(f"tier {self.name!r} is closed")
        if self._reopen is not None:
            raise BackendError(f"tier {self.name!r} has not opened: {self.health.last_error}")
        return self.handle.scan(namespace)

    def snapshot(self) -> dict[str, Any]:
        """Counters, latency, health and the backend's own figures."""
        out = self.stats.snapshot()
        out["name"] = self.name
        out["backend"] = self.config.backend
        out["healthy"] = self.healthy
        last_error = self.health.last_error or self.write_health.last_error
        if last_error:
            out["last_error"] = last_error
        try:
            live = not self._closed and self._reopen is None
            out["backend_stats"] = dict(self.handle.stats()) if live else {}
        except Exception as exc:  # stats must never take a caller down
            out["backend_stats"] = {"error": repr(exc)}
        return out

