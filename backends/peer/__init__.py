"""The ``peer`` backend: a tier held by other nodes running ``kvtier serve``.

``peers`` lists them as ``host:port``; ``secret`` (typically
``${KVTIER_PEER_SECRET}``) turns on mutual HMAC authentication.  Placement:

``hash`` (default)
    Each key lives on exactly one peer, picked by consistent hashing
    (64 virtual nodes per peer on a BLAKE2b ring): capacity adds up across
    peers, and adding or removing a peer moves only about 1/N of the keys.
    While a peer is down its keys are misses.
``all``
    Replication: a put goes to every peer (``True`` if at least one stored
    it); get and lookup ask the peers in the listed order, each only for the
    keys the ones before it missed; evict removes from every peer.  Any one
    peer up serves everything it received.

Blocks are sent as the chain framed them; the server stores only framed
blocks of the tier's namespace (others are refused), so this backend serves
chains, not arbitrary bytes.  They are checked again on the way back
(against accidents: the xxh3 checksum is not a MAC, see :mod:`kvtier.peer.server`
for the trust model).  Each hook call has one deadline
(``request_timeout``): a dead, slow or misbehaving peer turns into misses for
its keys within it, never a hang.  A failed peer is retried after an
exponential, capped back-off; a peer that is down at open does not fail the
open, while a version mismatch or an authentication failure does.

Several threads may share an instance: requests are pipelined on each of a
peer's connections (written back to back), and because the server answers a
connection's requests in order, the thread whose reply is next on the wire
reads it itself, straight into its destination (``recv_into`` into the
caller's buffers in ``kvtier_get_into``).

``kvtier_keep`` marks blocks kept on the servers that hold them (KEEP and
RELEASE requests), at their own tiers, within those tiers' ``keep`` budget
for the tenant ``default`` (the server counts every namespace as it); a
server of before those requests answers each mark False (refused) and each
release None, and its connection stays up (docs/tenants.md, "Keep").
``kvtier_expire`` gives blocks a deadline at the servers' tiers (EXPIRE
requests) the same way; a server of before it answers each key False.
``kvtier_deadlines`` asks the servers what deadlines are left (DEADLINES
requests), so any client reads a deadline another set: per key the earliest
the servers' tiers hold; None from a server of before it, and for a peer that
failed.

``kvtier_scan`` is not implemented: the blocks live in the serving nodes'
own chains, which may span several tiers per node (RAM, disk, a bucket), so
a listing through this client could neither say which tier holds a block nor
repair or purge it there.  Operators run ``kvtier inspect``, ``scrub`` and
``purge`` on each serving node, against the chain file ``kvtier serve`` uses.

The package: :mod:`.ring` places keys under ``hash``; :mod:`.wire` holds the
connections, the pipelined requests and each peer's back-off.

May import :mod:`kvtier.block.buffers`, :mod:`kvtier.peer.protocol` (the wire
protocol, not the server) and :mod:`kvtier.spec`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kvtier.block.buffers import parts_nbytes
from kvtier.peer import protocol as pp
from kvtier.spec import (
    BackendError,
    BytesLike,
    Capabilities,
    ConnectionClosedError,
    Option,
    ProtocolError,
    RefusedError,
    earliest_deadlines,
)
from kvtier.spec.base import Deadlines, Evicted, Expire, GetInto, Keep, PutParts
from kvtier.spec.shared import CONCURRENCY, CONNECT_TIMEOUT, TIMEOUT, but

from .ring import Ring
from .wire import Conn, Payload, Peer, PeerDown, chunks, connect

__all__ = ["PeerBackend"]

log = logging.getLogger("kvtier.backends.peer")


def _check_peers(value: Any) -> None:
    if not isinstance(value, list) or not value:
        raise ValueError("expected a non-empty list of host:port addresses")
    for item in value:
        pp.parse_address(str(item))
    if len({str(v) for v in value}) != len(value):
        raise ValueError("peers are listed more than once")


def _within(low: float, high: float, what: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not low <= value <= high:
            raise ValueError(f"expected {what}, got {value}")

    return check


OPTIONS: Mapping[str, Option] = {
    "peers": Option("list", "servers running kvtier serve, as host:port", required=True,
                    check=_check_peers),
    "placement": Option("str", "hash: each key on one peer; all: every peer holds every key",
                        default="hash", choices=("hash", "all")),
    "connections": but(CONCURRENCY, default=2, check=_within(1, 64, "1 to 64 per peer")),
    "connect_timeout": but(CONNECT_TIMEOUT, default="2s", check=_within(1e-3, 3600, "1ms to 1h")),
    "request_timeout": but(TIMEOUT, default="10s", check=_within(1e-3, 3600, "1ms to 1h")),
    "secret": Option("str", "shared secret for HMAC authentication (both ways)",
                     default=None, secret=True),
    "max_payload": Option("size", "largest frame payload sent or accepted",
                          default="256MiB", check=_within(1 << 16, pp.MAX_U32, "64KiB to 4GiB-1")),
}


@dataclass
class _Call:
    """One request to one peer, for the keys at ``indices`` of the caller's batch."""

    peer: Peer
    indices: list[int]
    header: dict[str, Any]
    parts: Iterable[BytesLike] = ()  # taken as they are sent: see framing.Frame
    payload_len: int = 0
    conn: Conn | None = None
    rid: int = 0
    lacking: bool = False  # an optional request the peer's server predates: not sent


#: Consumes one reply; returns the indices to ask the same peer for again.
Handler = Callable[[_Call, pp.Reply, Payload], list[int]]


@dataclass
class _Round:
    """One round of requests to the peers a batch needs, and what came of it."""

    started: float
    deadline: float
    retry: bool  # a pooled connection found dead may be replaced once
    calls: list[_Call] = field(default_factory=list)  # in the order sent
    failed: dict[int, str] = field(default_factory=dict)  # peer index -> why
    stale: set[int] = field(default_factory=set)  # peers whose pooled connection was dead
    done: set[int] = field(default_factory=set)  # indices whose reply was handled
    # did not fit in a reply: ask the same peer again
    again: dict[int, list[int]] = field(default_factory=dict)


class PeerBackend(PutParts, GetInto, Keep, Expire, Deadlines):
    """Blocks held by other nodes' ``kvtier serve``, over the kvtier peer protocol."""

    name = "peer"
    OPTIONS = OPTIONS

    def __init__(self) -> None:
        # No I/O here: kvtier instantiates backends just to read their options.
        super().__init__()
        self._peers: list[Peer] = []
        self._placement = "hash"
        self._ring = Ring([])
        self._namespace = ""
        self._secret: bytes | None = None
        self._connect_timeout = 2.0
        self._request_timeout = 10.0
        self._max_payload = pp.DEFAULT_MAX_PAYLOAD
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(
            ("requests", "bytes_sent", "bytes_received", "timeouts", "errors", "pipelined"), 0)
        # blocks a get_into could not place (another size): the chain asks for
        # exactly these with kvtier_get next, in the same thread
        self._stash = threading.local()

    # lifecycle ------------------------------------------------------------------
    def _open(self, options: Mapping[str, Any], namespace: str) -> None:
        # checked against OPTIONS already (BackendHandle.open): parsed, in range
        addresses = [pp.parse_address(str(p)) for p in options["peers"]]
        self._peers = [Peer(i, host, port, [None] * options["connections"])
                       for i, (host, port) in enumerate(addresses)]
        self._placement = options["placement"]
        self._namespace = namespace
        secret = (options["secret"] or "").strip()
        self._secret = secret.encode() if secret else None
        self._connect_timeout = options["connect_timeout"]
        self._request_timeout = options["request_timeout"]
        self._max_payload = options["max_payload"]
        self._ring = Ring([p.label for p in self._peers])
        # Connect eagerly so a version mismatch or a wrong secret fails the open with
        # a clear error; a peer that is merely down is marked so and retried later.
        refused: list[str] = []

        def probe(peer: Peer) -> None:
            try:
                peer.connection(self._connect, time.monotonic() + self._connect_timeout)
            except RefusedError as exc:
                refused.append(str(exc))
            except (OSError, ProtocolError) as exc:
                log.warning("peer %s is not reachable at open (%s); it will be retried",
                            peer.label, exc)

        with ThreadPoolExecutor(len(self._peers), thread_name_prefix="kvtier-peer-open") as pool:
            list(pool.map(probe, self._peers))  # in parallel: open waits one timeout at most
        if refused:
            self._close()  # the open failed: nothing stays connected
            raise BackendError("; ".join(sorted(refused)))

    def _capabilities(self) -> Capabilities:
        # persistence is the server's business, which this client cannot promise
        # framed_only: the server keeps only blocks framed by a chain of the
        # connection's namespace (it checks each header), so kvtier conformance
        # certifies this backend through a chain of one peer tier
        return Capabilities(persistent=False, shared=True, thread_safe=True, framed_only=True,
                            reports_evictions=False, max_block_size=self._max_payload,
                            extra={"placement": self._placement, "peers": len(self._peers)})

    def _stats(self) -> Mapping[str, int | float]:
        with self._lock:
            out: dict[str, int | float] = dict(self._counts)
        out["peers"] = len(self._peers)
        out["peers_up"] = sum(p.up for p in self._peers)
        for peer in self._peers:
            out[f"peer.{peer.label}.up"] = int(peer.up)
            for name, value in peer.counts.items():
                out[f"peer.{peer.label}.{name}"] = value
        out["reconnects"] = sum(p.counts["reconnects"] for p in self._peers)
        return out

    def _close(self) -> None:
        for peer in self._peers:
            for conn in peer.slots:
                if conn is not None:
                    conn.close()

    # data path --------------------------------------------------------------------
    def _put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> list[bool]:
        return self._send_blocks(keys, [[b] for b in blocks])

    def _put_parts(
        self, keys: Sequence[bytes], parts: Sequence[Sequence[BytesLike]], evicted: Evicted
    ) -> list[bool]:
        return self._send_blocks(keys, parts)  # the parts go to sendmsg as they are: no join

    def _send_blocks(
        self, keys: Sequence[bytes], parts: Sequence[Sequence[BytesLike]]
    ) -> list[bool]:
        sizes = [parts_nbytes(block) for block in parts]
        stored = [False] * len(keys)
        # a block larger than a frame can never travel: refused, like a full store
        fits = [i for i, size in enumerate(sizes) if size <= self._max_payload]

        def build(peer: Peer, chunk: list[int]) -> _Call:
            return _Call(peer, chunk, {"t": pp.PUT, "k": [keys[i] for i in chunk],
                                       "s": [sizes[i] for i in chunk]},
                         (p for i in chunk for p in parts[i]), sum(sizes[i] for i in chunk))

        self._dispatch("put", keys, fits, build, self._flags_into(stored), sizes)
        return stored

    def _get(self, keys: Sequence[bytes]) -> Sequence[BytesLike | None]:
        stash: dict[bytes, BytesLike] = getattr(self._stash, "blobs", {})
        self._stash.blobs = {}
        found: list[BytesLike | None] = [stash.get(key) for key in keys]

        def place(i: int, size: int, payload: Payload) -> int:
            found[i] = payload.read(size)  # recv_into a buffer of its own: no joining
            return size

        self._fetch(keys, [i for i, f in enumerate(found) if f is None], None, place)
        return found

    def _get_into(
        self, keys: Sequence[bytes], buffers: Sequence[Sequence[memoryview]]
    ) -> Sequence[int | None]:
        expected = [sum(v.nbytes for v in views) for views in buffers]
        stash: dict[bytes, BytesLike] = {}
        self._stash.blobs = stash

        def place(i: int, size: int, payload: Payload) -> int:
            if size == expected[i]:
                for view in buffers[i]:  # the zero-copy path: socket -> caller's memory
                    payload.into(view if view.format == "B" else view.cast("B"))
            else:
                stash[keys[i]] = payload.read(size)
            return size

        return self._fetch(keys, list(range(len(keys))), expected, place)

    def _fetch(self, keys: Sequence[bytes], wanted: list[int], expected: list[int] | None,
               place: Callable[[int, int, Payload], int]) -> list[int | None]:
        """GET the keys at ``wanted``; ``place`` consumes each found blob; sizes per key."""
        sizes: list[int | None] = [None] * len(keys)

        def build(peer: Peer, chunk: list[int]) -> _Call:
            return _Call(peer, chunk, {"t": pp.GET, "k": [keys[i] for i in chunk]})

        def done(call: _Call, reply: pp.Reply, payload: Payload) -> list[int]:
            if reply.sizes is None or len(reply.sizes) != len(call.indices):
                raise ProtocolError("GET reply does not match its keys")
            again = []
            for i, size in zip(call.indices, reply.sizes):
                if size == pp.RETRY:
                    again.append(i)
                elif size is not None:
                    sizes[i] = place(i, size, payload)
            return again

        self._dispatch("get", keys, wanted, build, done, expected,
                       resolved=lambda i: sizes[i] is not None)
        return sizes

    def _lookup(self, keys: Sequence[bytes]) -> Sequence[bool]:
        return self._flag_op(pp.LOOKUP, keys)

    def _evict(self, keys: Sequence[bytes]) -> Sequence[bool]:
        return self._flag_op(pp.EVICT, keys)

    def _flag_op(self, kind: int, keys: Sequence[bytes]) -> list[bool]:
        result = [False] * len(keys)

        def build(peer: Peer, chunk: list[int]) -> _Call:
            return _Call(peer, chunk, {"t": kind, "k": [keys[i] for i in chunk]})

        # with placement "all", a lookup stops at the first peer holding a key,
        # an evict must reach every peer
        self._dispatch(pp.NAMES[kind].lower(), keys, list(range(len(keys))), build,
                       self._flags_into(result), None,
                       result.__getitem__ if kind == pp.LOOKUP else None)
        return result

    def _keep(self, keys: Sequence[bytes], keep: bool) -> list[bool | None]:
        # a release where the server predates RELEASE: no mark there to release
        return self._outcomes("keep", keys, {"t": pp.KEEP if keep else pp.RELEASE},
                              refused_if_lacking=keep)

    def _expire(self, keys: Sequence[bytes], after: float) -> list[bool | None]:
        return self._outcomes("expire", keys, {"t": pp.EXPIRE, "d": float(after)},
                              refused_if_lacking=True)

    def _deadlines(self, keys: Sequence[bytes]) -> list[float | None]:
        # per key the earliest deadline a server answered (each holds its own, under
        # placement "all"); a server of before DEADLINES is sent none
        result: list[float | None] = [None] * len(keys)

        def build(peer: Peer, chunk: list[int]) -> _Call:
            return _Call(peer, chunk, {"t": pp.DEADLINES, "k": [keys[i] for i in chunk]})

        def done(call: _Call, reply: pp.Reply, payload: Payload) -> list[int]:
            if reply.left is None or len(reply.left) != len(call.indices):
                raise ProtocolError("DEADLINES reply does not match its keys")
            earliest_deadlines(result, reply.left, call.indices)
            return []

        self._dispatch("deadlines", keys, list(range(len(keys))), build, done, None)
        return result

    def _outcomes(self, what: str, keys: Sequence[bytes], header: dict[str, Any],
                  refused_if_lacking: bool) -> list[bool | None]:
        # per key: False where a server refused (or cannot: it predates the request),
        # else True where one did it, else None (held by none)
        result: list[bool | None] = [None] * len(keys)
        calls: list[_Call] = []

        def build(peer: Peer, chunk: list[int]) -> _Call:
            calls.append(_Call(peer, chunk, {**header, "k": [keys[i] for i in chunk]}))
            return calls[-1]

        def done(call: _Call, reply: pp.Reply, payload: Payload) -> list[int]:
            if reply.marks is None or len(reply.marks) != len(call.indices):
                raise ProtocolError(f"{pp.NAMES[header['t']]} reply does not match its keys")
            for i, answer in zip(call.indices, reply.marks):
                if answer is False or (answer is True and result[i] is None):
                    result[i] = answer
            return []

        self._dispatch(what, keys, list(range(len(keys))), build, done, None)
        for call in calls:
            for i in call.indices if call.lacking and refused_if_lacking else ():
                result[i] = False
        return result

    # machinery --------------------------------------------------------------------
    @staticmethod
    def _flags_into(result: list[bool]) -> Handler:
        def done(call: _Call, reply: pp.Reply, payload: Payload) -> list[int]:
            if reply.flags is None or len(reply.flags) != len(call.indices):
                raise ProtocolError("reply flags do not match the request's keys")
            for i, flag in zip(call.indices, reply.flags):
                result[i] = result[i] or flag
            return []

        return done

    def _dispatch(self, what: str, keys: Sequence[bytes], indices: list[int],
                  build: Callable[[Peer, list[int]], _Call], handle: Handler,
                  sizes: list[int] | None,
                  resolved: Callable[[int], bool] | None = None) -> None:
        """Route a batch by placement; BackendError only if every peer it needed failed.

        ``hash``: each key to its owner.  ``all``: every key to every peer, or,
        given ``resolved`` (get, lookup), to one peer after another for the keys
        still unresolved.
        """
        if self._placement == "hash":
            groups = self._ring.by_owner(keys, indices)
            self._check_failures(what, groups, self._run(what, groups, keys, build, handle,
                                                         sizes))
            return
        if resolved is None:
            groups = {p.index: indices for p in self._peers} if indices else {}
            self._check_failures(what, groups, self._run(what, groups, keys, build, handle,
                                                         sizes))
            return
        failed: dict[int, str] = {}
        asked: list[int] = []
        for peer in self._peers:
            indices = [i for i in indices if not resolved(i)]
            if not indices:
                break
            asked.append(peer.index)
            failed.update(self._run(what, {peer.index: indices}, keys, build, handle, sizes))
        self._check_failures(what, asked, failed)

    def _run(self, what: str, groups: Mapping[int, list[int]], keys: Sequence[bytes],
             build: Callable[[Peer, list[int]], _Call], handle: Handler,
             sizes: list[int] | None, retry: bool = True) -> dict[int, str]:
        """Send every peer its requests, then read the replies; returns the failed peers.

        Keys of a failed peer stay misses; see :meth:`_check_failures`.
        """
        started = time.monotonic()
        run = _Round(started, started + self._request_timeout, retry)
        self._send(run, what, groups, keys, build, sizes)
        self._receive(run, what, handle)
        redo = {p: [i for i in groups[p] if i not in run.done] for p in run.stale}
        # a reply must make progress, or a server could make us ask forever
        for p, indices in run.again.items():
            if indices and len(indices) < len(groups[p]) and p not in run.failed:
                redo.setdefault(p, []).extend(indices)
        if redo:
            run.failed.update(self._run(what, redo, keys, build, handle, sizes,
                                        retry and not run.stale))
        return run.failed

    def _send(self, run: _Round, what: str, groups: Mapping[int, list[int]],
              keys: Sequence[bytes], build: Callable[[Peer, list[int]], _Call],
              sizes: list[int] | None) -> None:
        """Write each peer its share as requests that fit; they land in ``run.calls``."""
        # Sends and reads go in ascending peer order in every thread; with replies
        # in request order per connection that order rules out two threads each
        # waiting for the other to read a reply first.
        for peer_index in sorted(groups):
            peer = self._peers[peer_index]
            conn: Conn | None = None
            try:
                conn = peer.connection(self._connect, run.deadline)
                for chunk in chunks(keys, groups[peer_index], sizes, conn.max_payload,
                                    hard=what == "put"):
                    call = build(peer, chunk)
                    if call.header["t"] in pp.OPTIONAL and call.header["t"] not in conn.extras:
                        call.lacking = True  # its server predates the request: not sent
                        run.done.update(chunk)
                        continue
                    call.rid, pipelined, sent = conn.send(call.header, call.parts,
                                                          call.payload_len, run.deadline)
                    call.parts, call.conn = (), conn
                    run.calls.append(call)
                    self._count(requests=1, bytes_sent=sent, pipelined=int(pipelined))
                    with peer.lock:
                        peer.counts["requests"] += 1
            except (OSError, ProtocolError, RefusedError) as exc:
                self._trouble(run, peer, conn, exc)

    def _receive(self, run: _Round, what: str, handle: Handler) -> None:
        """Read the replies to ``run.calls`` in the order sent, each through ``handle``."""
        for call in run.calls:
            peer, conn = call.peer, call.conn
            assert conn is not None
            if peer.index in run.failed or peer.index in run.stale:
                conn.fail("abandoned after an earlier failure")
                continue
            try:
                with conn.reply(call.rid, run.deadline) as (message, payload):
                    if isinstance(message, pp.Error):  # this request failed on the server
                        log.warning("peer %s: %s failed: %s", peer.label, what, message.message)
                        self._count(errors=1)
                    else:
                        received = payload.remaining
                        run.again.setdefault(peer.index, []).extend(
                            handle(call, message, payload))
                        self._count(bytes_received=received)
                run.done.update(call.indices)
            except (OSError, ProtocolError) as exc:
                self._trouble(run, peer, conn, exc)

    def _trouble(self, run: _Round, peer: Peer, conn: Conn | None, exc: BaseException) -> None:
        # A restarted server leaves dead connections in the pool, found out only
        # by using them: a pooled connection that fails before any reply byte
        # gets one retry on a fresh one instead of costing a batch of misses.
        if run.retry and conn is not None and conn.born < run.started and (
            isinstance(exc, BrokenPipeError | ConnectionResetError)
            or (isinstance(exc, ConnectionClosedError) and not exc.received)
        ):
            run.stale.add(peer.index)
            peer.drop("found dead")
        elif peer.index not in run.stale:
            self._peer_failed(peer, exc, run.failed)

    @staticmethod
    def _check_failures(what: str, involved: Iterable[int], failed: Mapping[int, str]) -> None:
        """Raise BackendError when every peer a batch needed failed, else leave misses.

        A partial failure must not raise: the chain would mark the whole tier
        unhealthy and throw away the answers of the peers that are up.  When no
        peer answered, raising lets the chain skip this tier for its growing
        back-off instead of paying a failed round trip on every batch.
        """
        needed = set(involved)
        if needed and needed <= failed.keys():
            raise BackendError(f"peer {what}: no peer reachable: "
                               + "; ".join(failed[i] for i in sorted(needed)))

    def _peer_failed(self, peer: Peer, exc: BaseException, failed: dict[int, str]) -> None:
        if isinstance(exc, TimeoutError) or isinstance(exc.__cause__, TimeoutError):
            self._count(timeouts=1)
        if peer.index not in failed and not isinstance(exc, PeerDown):
            peer.fault(f"{type(exc).__name__}: {exc}")  # PeerDown: already counted
        failed[peer.index] = f"{peer.label}: {exc}"

    def _count(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                self._counts[name] += n

    def _connect(self, peer: Peer, deadline: float) -> Conn:
        return connect(peer, deadline, namespace=self._namespace, secret=self._secret,
                       max_payload=self._max_payload, timeout=self._connect_timeout)

    # for operators and tests --------------------------------------------------------
    def server_stats(self) -> dict[str, dict[str, Any] | None]:
        """Each peer's server-side figures (its STATS reply), None for a peer that failed."""
        self.ensure_open()
        out: dict[str, dict[str, Any] | None] = {p.label: None for p in self._peers}

        def build(peer: Peer, chunk: list[int]) -> _Call:
            return _Call(peer, chunk, {"t": pp.STATS})

        def done(call: _Call, reply: pp.Reply, payload: Payload) -> list[int]:
            out[call.peer.label] = pp.unpack_stats(payload.read(payload.remaining))
            return []

        # one dummy index per peer drives the one STATS request each
        self._run("stats", {p.index: [0] for p in self._peers}, [b"-"], build, done, None)
        return out
