"""The block-store contract: the hooks a kvtier backend implements.

A backend is a class whose instances carry ``@hookimpl`` methods named after
the hooks below.  kvtier makes one instance per tier (the class is called with
no arguments and must do no I/O), registers it with a pluggy plugin manager
that validates it against this file, asks it for ``kvtier_options``, then
calls ``kvtier_open`` and the data hooks.  An implementation may accept fewer
parameters than the spec lists (pluggy passes only what it names), never
more; a method named ``kvtier_*`` that matches no hook here is rejected.

Conventions that hold for every data hook:

* Calls are **batched**: ``keys`` is a sequence of ``bytes`` (1 to
  :data:`MAX_KEY_SIZE` bytes, checked by kvtier before the call) and the
  answer is a sequence of the same length, in the same order.  Empty batches
  happen and answer an empty sequence.  The same key may appear twice.
* A **miss** is ``None`` or ``False`` in the answer, never an exception.
* A **fault** (I/O error, server unreachable) raises
  :class:`~kvtier.spec.BackendError` or any ``OSError``.  The chain marks the
  tier unhealthy for a while and serves its operations as misses.
* Blocks are **immutable per key**: storing a key that is already stored may
  be skipped, and the answer is still ``True``; the stored bytes stay.  Within
  one batch, the **first** occurrence of a repeated key is the one stored and
  every later one answers ``True`` without storing (kvtier never sends
  different bytes under one key on purpose: keys name content).  Across
  instances sharing a store (``shared=True``), either writer's copy may be the
  survivor, but a reader always sees one whole copy.
* **Capacity** (``Capabilities.capacity``, ``capacity_bytes``) counts the
  blocks of the namespace the instance was opened with: one instance serves
  one namespace, so a store holding N namespaces may hold up to N times the
  capacity.  Bytes are counted as stored (the framed block, header included).
* **Recency**: ``kvtier_get``, ``kvtier_get_into`` and a ``kvtier_put`` of a
  key already stored count as uses for a backend that evicts by recency;
  ``kvtier_lookup`` and ``kvtier_scan`` do not (the chain probes every tier
  with lookups, and an operator's scan must not reorder the cache).
* **Thread safety**: if :attr:`Capabilities.thread_safe` is true, any hook may
  be called from several threads at once; otherwise kvtier serialises calls.
* After ``kvtier_close`` every hook except ``kvtier_close`` (idempotent) and
  ``kvtier_options`` (pure introspection) raises
  :class:`~kvtier.spec.ClosedError`.  ``kvtier_capabilities`` on an instance
  that was never opened is no exception to this: it answers for the default
  options (see there); after close it raises.

Four hooks are required (:data:`REQUIRED_HOOKS`): ``kvtier_put``,
``kvtier_get``, ``kvtier_lookup`` and ``kvtier_evict``.  Every other hook is
optional and has a section of its own below; a backend that leaves one out
gets kvtier's default (no options, default capabilities, no figures, nothing
to open or close), and the optional fast paths ``kvtier_put_parts`` (gather
write) and ``kvtier_get_into`` (scatter read) are simply not used.  A simple
backend implements the four required hooks only, storing and returning
``bytes``.

Every hook that answers is a pluggy *first-result* hook: the first non-None
answer is the answer, so one backend instance answers each call alone.
``kvtier_scan`` (contract 1.1) lets operators' tools (``kvtier inspect``,
``scrub``, ``purge``) list what a store holds.  ``kvtier_keep`` (contract 1.2)
marks blocks kept, out of the eviction order, within a tenant's retention
budget; a backend without it simply keeps nothing.  ``kvtier_expire``
(contract 1.3) gives blocks a deadline of their own, sooner than the tier's
``expire``; a backend without it keeps the tier's expiry alone.
``kvtier_deadlines`` (contract 1.4) says what deadlines are left, so that a
copy of a block (a promotion, a demotion) takes its block's deadline along.

Raw access to the stored bytes, which the conformance kit's ``corruption``
group needs, is no hook: the chain never asks for it.  It is the kit's
business (:class:`kvtier.testing.RawAccess`); the hook ``kvtier_tamper``
that gave it is in :mod:`kvtier.spec.deprecated` for one release.
"""

# mypy: disable-error-code="empty-body"
# Hook specs are signatures and docstrings only; pluggy never calls them.
from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableSequence, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .types import Capabilities, Option, ScanEntry

__all__ = [
    "CONTRACT_VERSION",
    "MAX_KEY_SIZE",
    "REQUIRED_HOOKS",
    "BytesLike",
    "hookimpl",
    "hookspec",
]

#: Version of this contract, ``"MAJOR.MINOR"``.  A new optional hook bumps the
#: minor number; a changed signature or meaning bumps the major number.
#: 1.1 added ``kvtier_scan``; 1.2 added ``kvtier_keep``; 1.3 added ``kvtier_expire``;
#: 1.4 added ``kvtier_deadlines``.
CONTRACT_VERSION = "1.4"

#: The hooks every backend implements; the others are optional.
REQUIRED_HOOKS = ("kvtier_put", "kvtier_get", "kvtier_lookup", "kvtier_evict")

#: Longest key kvtier passes to a backend, in bytes.
MAX_KEY_SIZE = 64

#: What a block can be: any C-contiguous buffer of bytes.
BytesLike = bytes | bytearray | memoryview

hookspec = pluggy.HookspecMarker("kvtier")
hookimpl = pluggy.HookimplMarker("kvtier")


# -------------------------------------------------------------------------
# required: the data path
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def kvtier_put(
    keys: Sequence[bytes],
    blocks: Sequence[BytesLike],
    evicted: MutableSequence[tuple[bytes, BytesLike]],
) -> Sequence[bool]:
    """Store ``blocks[i]`` under ``keys[i]``.

    :param keys: the keys, see the conventions above.
    :param blocks: the blocks, as bytes-like objects, valid only during the
        call: a backend that keeps one must copy it (keeping a reference to a
        ``bytes`` object is such a copy).  Copy once.
    :param evicted: a list to which a backend with a capacity appends
        ``(key, block)`` for every block this call pushed out, before
        dropping it, so the chain can move it to the tier below.  The block
        handed over must stay valid after the call (``bytes`` is ideal).
        Backends without capacity, or that declare
        ``reports_evictions=False``, ignore it.

    :return: one ``bool`` per key: ``True`` if the block is now stored (or
        already was), ``False`` if it was refused (larger than the capacity
        or ``max_block_size``, or, for a backend declaring
        ``Capabilities.framed_only``, not a frame of its namespace).  A
        refused block is not an error.

    A reader must never see a partial block: publish atomically.  A key
    already stored keeps its bytes, and a key repeated in the batch stores
    its first occurrence (see the conventions above).
    """


@hookspec(firstresult=True)
def kvtier_get(keys: Sequence[bytes]) -> Sequence[BytesLike | None]:
    """Fetch blocks.

    :param keys: the keys, see the conventions above.
    :return: per key, the block exactly as stored (a bytes-like object the
        caller may keep and the backend must never modify afterwards), or
        ``None`` for a miss.  A backend in process memory (see
        ``Capabilities.shared``) is read through this hook even when it
        implements ``kvtier_get_into``: returning the stored object itself,
        not a copy, keeps such a read to one copy.
    """


@hookspec(firstresult=True)
def kvtier_lookup(keys: Sequence[bytes]) -> Sequence[bool]:
    """Tell which keys are stored, without reading their blocks.

    :param keys: the keys, see the conventions above.
    :return: per key, ``True`` if a ``kvtier_get`` issued now would hit.  A
        backend may answer from a short-lived cache; ``kvtier_get`` remains
        the authority (a stale ``True`` becomes a miss there).  A lookup is
        not a use: it must not refresh a block's recency.
    """


@hookspec(firstresult=True)
def kvtier_evict(keys: Sequence[bytes]) -> Sequence[bool]:
    """Remove blocks.

    :param keys: the keys, see the conventions above.
    :return: per key, ``True`` if a block was removed by this call, ``False``
        if the key was not stored (which is harmless).  Evicted blocks are
        not reported through ``evicted``: the caller asked for their removal.
    """


# -------------------------------------------------------------------------
# optional: lifecycle and introspection
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def kvtier_options() -> Mapping[str, Option] | None:
    """Declare the options this backend accepts in its tier entry.

    Called on a fresh instance before ``kvtier_open``, also by
    ``kvtier config validate`` and ``kvtier backends``; must not do I/O.

    :return: a mapping from option name to :class:`~kvtier.spec.Option`.
        kvtier rejects any other key in the tier entry, fills defaults, and
        parses sizes and durations before ``kvtier_open`` sees them.
    """


@hookspec
def kvtier_open(options: Mapping[str, Any], namespace: str) -> None:
    """Open the store: connect, create directories, rebuild indexes.

    :param options: the tier's options, validated against
        ``kvtier_options`` and with defaults filled in.
    :param namespace: a 32-character lowercase hex string naming the KV
        namespace (model, dtype, layout, tenant, ...).  Blocks of different
        namespaces are never interchangeable; a backend may use it to lay
        out storage (a directory, a key prefix).  Keys are only unique
        within one namespace.  A tenant is a namespace of its own
        (docs/tenants.md): a backend that keeps namespaces apart keeps
        tenants apart, and no hook names a tenant.

    Raise :class:`~kvtier.spec.ConfigError` for bad option values (with
    ``key=`` the option name) and :class:`~kvtier.spec.BackendError` when the
    store cannot be reached; the message should name the location (URL,
    endpoint, bucket) but never a credential.  A chain tells them apart: a
    ``ConfigError`` fails its open, while a tier whose open raised anything
    else starts failed (unless configured ``required``), and the chain opens
    a fresh instance after a back-off; the instance whose open raised is
    asked only ``kvtier_capabilities`` (as one never opened) and closed.
    """


@hookspec(firstresult=True)
def kvtier_capabilities() -> Capabilities:
    """Declare what this open instance can do.

    Called after ``kvtier_open``.  The answer may depend on options (a
    ``memory://`` filesystem is not persistent, ``file://`` is).  ``kvtier
    backends`` also calls it on an instance that was never opened, to list
    what the backend can do: answer for its default options then, without I/O.

    :return: a :class:`~kvtier.spec.Capabilities`.
    """


@hookspec(firstresult=True)
def kvtier_stats() -> Mapping[str, int | float] | None:
    """Report the backend's own figures.

    kvtier counts hits, misses, bytes and latency itself; this hook adds what
    only the backend knows.  Use these names where they apply:
    ``used_bytes`` (bytes held in this namespace, as counted against
    capacity), ``blocks`` (number of blocks held), ``capacity_bytes`` (the
    capacity, equal to ``Capabilities.capacity``; **leave it out** when the
    store is unbounded, never report 0 or a large sentinel), ``evictions``.
    A backend that cannot count cheaply (an object store without an index)
    leaves ``used_bytes`` and ``blocks`` out rather than guessing.

    :return: a flat mapping of names to numbers.
    """


@hookspec
def kvtier_close() -> None:
    """Release everything the instance holds.

    Idempotent: a second call does nothing.  A persistent backend must have
    made every block it answered ``True`` for in ``kvtier_put`` visible to a
    later ``kvtier_open`` with the same options.

    ``persistent=True`` promises more than a clean close: a block whose put
    answered ``True`` is already in the store, not in this process, so it
    survives the process being killed (``SIGKILL``) right after the answer,
    and a later open finds it exact.  A block whose put was still running is
    absent or exact, never partial.  Power loss and a restart of a server are
    the store's own durability (the ``fs`` backend's ``fsync: true``, Redis'
    persistence settings), which the contract does not promise.
    """


# -------------------------------------------------------------------------
# optional: zero-copy fast paths
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def kvtier_put_parts(
    keys: Sequence[bytes],
    parts: Sequence[Sequence[BytesLike]],
    evicted: MutableSequence[tuple[bytes, BytesLike]],
) -> Sequence[bool]:
    """Store blocks given as gather lists, without joining them.

    Same as ``kvtier_put``, except that block ``i`` is the concatenation of
    ``parts[i]`` (typically a small header and a large payload).  Implement
    it when the store can write several buffers at once (``os.writev``,
    ``socket.sendmsg``); kvtier then prefers it and skips one copy.

    :param keys: the keys, see the conventions above.
    :param parts: per key, the bytes-like pieces of the block, in order,
        valid only during the call.  A piece may be made when first read
        (kvtier makes an uncompressed block's header, and its checksum,
        then), so a store writing block by block overlaps that work with
        the write of the block before; ``len(parts[i])`` costs nothing.
    :param evicted: as in ``kvtier_put``.
    :return: as in ``kvtier_put``.
    """


@hookspec(firstresult=True)
def kvtier_get_into(
    keys: Sequence[bytes], buffers: Sequence[Sequence[memoryview]]
) -> Sequence[int | None]:
    """Fetch blocks straight into the caller's buffers.

    :param keys: the keys, see the conventions above.
    :param buffers: per key, a scatter list of writable byte memoryviews
        whose total length is the size the caller expects the block to have.
    :return: per key, ``None`` for a miss, else the stored block's size in
        bytes.  When that size equals the total length of ``buffers[i]`` the
        block has been written across them in order; when it differs the
        buffers' content is unspecified and kvtier falls back to
        ``kvtier_get`` for that key.
    """


# -------------------------------------------------------------------------
# optional: for operators (contract 1.1)
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def kvtier_scan(namespace: str | None) -> Iterator[Sequence[ScanEntry]]:
    """List what the store holds, in batches.

    :param namespace: a 32-hex-digit namespace to list the blocks of (any
        namespace of the store, not only the one this instance was opened
        with), or ``None`` for every namespace the store holds.  A store
        shared by several namespaces (a directory, a bucket prefix, a Redis
        key prefix) lists all of them; one that only holds its own (RAM)
        lists that one.
    :return: an iterator of batches (sequences, of any length from 1),
        each of :class:`~kvtier.spec.ScanEntry` or plain tuples
        ``(namespace, key, size, mtime)``: the namespace hex, the key,
        ``size`` the stored bytes of the block (what ``kvtier_get`` would
        return, the framed block with its header), ``mtime`` when the block
        was stored, in seconds since the epoch, or ``None`` where the store
        does not know.  Only blocks: a backend's own bookkeeping (indexes,
        counters, temporary files) is never listed.

    The call itself checks that the instance is open (``ClosedError``
    otherwise, raised by the call, not at the first batch) and may raise a
    fault; the iterator may raise faults too, and ``ClosedError`` if the
    instance is closed while it is read.  A scan is not a snapshot: blocks
    stored or removed meanwhile may or may not be listed, a block present
    throughout is listed at least once (a store that may list one twice,
    such as Redis' ``SCAN``, says so: callers count distinct keys).  A scan
    is not a use (see recency above) and must not hold a lock that stops the
    data path for longer than one batch.  Backends without it make
    ``kvtier inspect``, ``scrub`` and ``purge`` refuse the tier.
    """


# -------------------------------------------------------------------------
# optional: retention (contract 1.2: keep; 1.3: expire; 1.4: deadlines)
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def kvtier_keep(keys: Sequence[bytes], keep: bool) -> Sequence[bool | None]:
    """Mark blocks kept (``keep=True``), or release their marks (``keep=False``).

    A **kept** block is never a victim of the backend's capacity or of its
    tenant's quota while marked: a put that could only fit by evicting kept
    blocks is refused instead.  Two things still remove it: its expiry
    (``expire``: expiry wins over keep) and an explicit ``kvtier_evict``.
    The mark belongs to the block as stored and goes with it: a block stored
    again after it left is unmarked.  A store shared by processes
    (``shared=True``) keeps the mark for all of them.

    Marks are bounded by the **retention budget** of the instance's tenant
    (``keep`` in the tier's ``tenants`` rules, at most its quota; 0 where no
    rule gives one): the bytes of the tenant's kept blocks, as counted
    against capacity, never exceed it.  Keeping a block beyond it is refused
    for that block (the batch is marked in order, so the blocks within the
    budget are kept) and counted in the backend's figures as
    ``keep_refused``.

    :param keys: the keys, see the conventions above.
    :param keep: True to mark, False to release.
    :return: per key, ``True`` if the block is now kept (``keep``) or not
        kept (release, whether it was marked or not), ``False`` if marking
        it was refused (for the budget, or by an instance whose
        configuration keeps no marks while its capacity may evict), ``None``
        if the key is not stored.
        Marking a kept block again answers ``True`` and counts it once.
        A lookup, a get or a scan is no change to the mark.

    Backends without this hook keep nothing: the chain's ``keep`` skips
    them (docs/tenants.md, "Retention").
    """


@hookspec(firstresult=True)
def kvtier_expire(keys: Sequence[bytes], after: float) -> Sequence[bool | None]:
    """Give blocks a deadline: each expires ``after`` seconds from now.

    A deadline only brings a block's expiry forward: a block expires at its
    deadline or when the tier's own ``expire`` says (``after`` its write,
    ``unused`` since its last use), whichever comes first, so an
    operator's retention bound always holds.  A block with a deadline
    already keeps the earlier of the two.  An expired block is what any
    expired block is: a miss, its bytes freed, counted in ``expired``.  A
    kept block (``kvtier_keep``) still expires at its deadline.

    The deadline belongs to the block as stored and goes with it: a block
    stored again after it left has none.  A put of a key already stored
    is no change to it.  A store shared by processes (``shared=True``)
    expires the block for all of them, at the latest once each of them
    has seen the deadline (a backend says how soon in its documentation).

    :param keys: the keys, see the conventions above.
    :param after: seconds from now, above 0 (kvtier checks it before the
        call).
    :return: per key, ``True`` if the block now expires by then, ``False``
        if the backend refused the deadline for it (it cannot hold one
        there), ``None`` if the key is not stored.
        A lookup, a get or a scan is no change to the deadline.

    Backends without this hook hold no deadlines: the chain's ``expire``
    skips them (docs/tenants.md, "Expiry").
    """


@hookspec(firstresult=True)
def kvtier_deadlines(keys: Sequence[bytes]) -> Sequence[float | None]:
    """How long the blocks' deadlines (``kvtier_expire``) have left.

    The chain asks the tier a block is copied from (a promotion up, a
    write-through down), where that tier is shared by processes, and gives
    the copy the same deadline where it lands, so a deadline goes with its
    block from tier to tier.  (A demotion's block has left the tier above
    when it is copied: the chain remembers the deadlines it set itself.)
    Only deadlines count: the tier's own ``expire`` is the operator's bound
    for that tier, and the tier a copy lands in has its own.  A store
    shared by processes (``shared=True``) answers the deadlines any of them
    set, once this instance has seen them (as soon as ``kvtier_expire``
    says a deadline is seen).

    :param keys: the keys, see the conventions above.
    :return: per key, the seconds left before the block's deadline, above 0;
        ``None`` if the key is not stored, its block has no deadline, or the
        deadline has passed (the block is then a miss).
        Asking is no use of the block (``expire``'s ``unused`` is not reset)
        and no change to it.

    Backends that implement ``kvtier_expire`` should implement this hook
    too: without it a copy taken from them carries no deadline.
    """
