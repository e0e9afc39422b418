"""The ``redis`` backend: KV-cache blocks as Redis strings, with a byte capacity and LRU.

One tier instance serves one namespace and writes its blocks under
``<prefix>:<namespace>:b:<key>`` (the key's bytes as they are, Redis keys
being binary-safe).  Its bookkeeping keys are the namespace's,
``<prefix>:<namespace>:``, or with ``tenants`` the pool's,
``<prefix>:pool:``, shared by every namespace (every tenant) under the
prefix (:mod:`kvtier_redis._scripts` describes them).  Several processes opening the
same options share one store, which is why the capacity is enforced by the
backend itself, inside Redis scripts, rather than left to Redis'
``maxmemory``: Redis counts its own overhead and would evict silently,
whereas kvtier needs a capacity counted in block bytes and every evicted
block handed to the tier below (``reports_evictions``), both of which the
conformance kit checks.

Round trips: a ``put`` is one pipeline of ``EVALSHA`` calls (one per
``batch_bytes`` of blocks), a ``get`` one pipeline of ``MGET`` and the
recency update, a ``lookup`` one pipeline of ``EXISTS``, an ``evict``, a
``keep``, an ``expire`` or a ``deadlines`` one script.  Large blocks go to
the socket from the caller's buffers, uncopied (redis-py sends big arguments as
they are).  ``kvtier_put_parts`` and ``kvtier_get_into`` are left out: a Redis
argument is one buffer and redis-py materialises each reply as ``bytes``, so
neither would save a copy.

``kvtier_keep`` marks blocks kept on the server, in the key space's ``kept``
hash, within the tenant's ``keep`` budget counted there too, so every process
sharing the space spares them (:data:`kvtier_redis._scripts.KEEP`).
``kvtier_expire`` brings a block's TTL forward to its deadline, on the server
(:data:`kvtier_redis._scripts.DEADLINE`), so it holds for every process, and
records the deadline there, which ``kvtier_deadlines`` reads back in the
server's time, one script a batch (:data:`kvtier_redis._scripts.LEFT`).

With ``cluster: true`` the hooks go to :class:`kvtier_redis._cluster.ClusterStore`
instead: the namespace split into hash-tagged shards on a Redis Cluster.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import NoScriptError, RedisError
from redis.retry import Retry

from kvtier.block.buffers import nbytes
from kvtier.spec import (
    BackendError,
    BytesLike,
    Capabilities,
    CapacityScope,
    ConfigError,
    ScanEntry,
)
from kvtier.spec.base import Deadlines, Evicted, Expire, Keep, Scan

from ._settings import OPTIONS, REDIS_MAX_STRING, Settings, redact
from ._space import (
    EVICT,
    SCRIPTS,
    STATS,
    TOUCH,
    Space,
    check_rules,
    keep_answers,
    left_answers,
    stats_of,
)

if TYPE_CHECKING:
    from ._cluster import ClusterStore

__all__ = ["REDIS_MAX_STRING", "RedisBackend"]

#: Blocks per put script at most: a script blocks the server while it runs.
_MAX_KEYS_PER_SCRIPT = 1024
#: Keys a SCAN call asks Redis to look at (a hint: it may answer more or fewer).
_SCAN_COUNT = 1000
_NAMESPACE_RE = re.compile(rb"^[0-9a-f]{32}$")
#: What a per-key script answers for one key: kept, set (None: not held), seconds left.
_Answer = TypeVar("_Answer")



@dataclass(frozen=True)
class _Conn:
    """What an open instance holds; swapped for None on close."""

    client: redis.Redis
    settings: Settings
    where: str  # the URL without credentials
    space: Space

    def data_key(self, key: bytes) -> bytes:
        return self.space.data_key(key)


def _as_buffer(block: BytesLike) -> bytes | bytearray | memoryview:
    # redis-py frames an argument by len(), which counts items, not bytes,
    # in a memoryview of another format or shape
    if isinstance(block, memoryview) and (block.format != "B" or block.ndim != 1):
        return block.cast("B")
    buffer: bytes | bytearray | memoryview = block
    return buffer


class RedisBackend(Scan, Keep, Expire, Deadlines):
    """A Redis tier; see the module docstring and contrib/kvtier-redis/README.md.

    The lifecycle, batch checks and repeated keys are kvtier's ``BlockStore``.
    """

    name = "redis"
    OPTIONS = OPTIONS

    def __init__(self) -> None:
        # kvtier also instantiates to read options: no connection here
        super().__init__()
        self._lock = threading.Lock()
        self._conn: _Conn | ClusterStore | None = None

    # lifecycle -------------------------------------------------------------
    def _open(self, options: Mapping[str, Any], namespace: str) -> None:
        settings = Settings.parse(options)
        with self._lock:
            self._conn = self._connect(settings, namespace)

    def _capabilities(self) -> Capabilities:
        with self._lock:
            conn = self._conn
        # unopened (`kvtier backends`): the defaults, without I/O
        settings = Settings.parse({}) if conn is None else conn.settings
        extra: dict[str, Any] = {}
        scope: CapacityScope = "pool" if settings.pooled else "namespace"
        max_block_size = settings.max_block_size
        if not isinstance(conn, _Conn) and conn is not None:
            # a block must fit in its shard's share of the capacity
            max_block_size = conn.limit
            scope = "shard"
            extra["shards"] = str(conn.shards)
        return Capabilities(
            # blocks outlive the instance (and any one client process) on the
            # server; surviving a server restart is Redis' own persistence setting
            persistent=True,
            shared=True,
            thread_safe=True,
            max_block_size=max_block_size,
            capacity=settings.capacity,
            reports_evictions=True,
            eviction="lru",
            capacity_scope=scope,
            extra=extra,
        )

    def _stats(self) -> dict[str, int]:
        conn = self._live()
        if not isinstance(conn, _Conn):
            stats = conn.stats()  # summed over the shards
        else:
            stats = stats_of(self._run(conn, [conn.space.call(STATS)])[0], conn.settings.tenant)
        if conn.settings.capacity is not None:
            stats["capacity_bytes"] = conn.settings.capacity
        return stats

    def _close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if isinstance(conn, _Conn):
            # every write was acknowledged by the server before its hook
            # returned, so closing loses nothing
            with contextlib.suppress(RedisError, OSError):
                conn.client.close()
        elif conn is not None:
            conn.close()

    # data path -------------------------------------------------------------
    def _put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> list[bool]:
        conn = self._live()
        if not isinstance(conn, _Conn):
            return conn.put(keys, blocks, evicted)
        settings = conn.settings
        buffers = [_as_buffer(block) for block in blocks]
        stored = [False] * len(keys)
        chunks: list[list[int]] = []
        chunk: list[int] = []
        chunk_bytes = 0
        too_large = 0
        for index, buffer in enumerate(buffers):
            size = nbytes(buffer)
            if size > settings.limit:
                too_large += 1
                continue  # refused, which is not an error
            if chunk and (
                chunk_bytes + size > settings.batch_bytes or len(chunk) >= _MAX_KEYS_PER_SCRIPT
            ):
                chunks.append(chunk)
                chunk, chunk_bytes = [], 0
            chunk.append(index)
            chunk_bytes += size
        if chunk:
            chunks.append(chunk)
        commands = [conn.space.put([keys[i] for i in part], [buffers[i] for i in part])
                    for part in chunks]
        if too_large:
            commands.append(conn.space.refused(settings.tenant, too_large))

        def report(answers: list[Any]) -> None:
            for part, answer in zip(chunks, answers):
                if isinstance(answer, list) and len(answer) == 2:
                    flags, pairs = answer
                    evicted.extend(zip(pairs[0::2], pairs[1::2]))
                    for index, flag in zip(part, flags):
                        stored[index] = bool(flag)

        self._run(conn, commands, report)
        return stored

    def _get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        conn = self._live()
        if not isinstance(conn, _Conn):
            return conn.get(keys)
        commands: list[tuple[Any, ...]] = [("MGET", *(conn.data_key(k) for k in keys))]
        if conn.settings.capacity is not None or conn.settings.pooled or conn.settings.expire:
            # recency only matters where something is evicted, and a use
            # pushes back an expiry after `unused`
            commands.append(conn.space.members(TOUCH, keys))
        found: list[bytes | None] = self._run(conn, commands)[0]
        return found

    def _lookup(self, keys: Sequence[bytes]) -> list[bool]:
        conn = self._live()
        if not isinstance(conn, _Conn):
            return conn.lookup(keys)
        # one EXISTS per key: EXISTS of several keys answers a count, not which
        answers = self._run(conn, [("EXISTS", conn.data_key(k)) for k in keys])
        return [bool(answer) for answer in answers]

    def _evict(self, keys: Sequence[bytes]) -> list[bool]:
        conn = self._live()
        if not isinstance(conn, _Conn):
            return conn.evict(keys)
        commands = [
            conn.space.members(EVICT, keys[start:end])
            for start, end in _ranges(len(keys), _MAX_KEYS_PER_SCRIPT)
        ]
        return [bool(flag) for flags in self._run(conn, commands) for flag in flags]

    def _keep(self, keys: Sequence[bytes], keep: bool) -> list[bool | None]:
        # on a cluster, a shard that failed answers False for its keys (not kept)
        return self._per_key("keep", keys, lambda space, part: space.keep(part, keep),
                             keep_answers, False)

    def _expire(self, keys: Sequence[bytes], after: float) -> list[bool | None]:
        # on a cluster, a shard that failed answers False for its keys (not set)
        return self._per_key("deadline", keys, lambda space, part: space.deadline(part, after),
                             keep_answers, False)

    def _deadlines(self, keys: Sequence[bytes]) -> list[float | None]:
        # on a cluster, a shard that failed answers None for its keys (none known)
        return self._per_key("deadlines", keys, Space.deadlines, left_answers, None)

    def _per_key(self, script: str, keys: Sequence[bytes],
                 command: Callable[[Space, list[bytes]], tuple[Any, ...]],
                 read: Callable[[Any, int], Sequence[_Answer] | None],
                 miss: _Answer) -> list[_Answer]:
        """One answer per key from a script (``command``) over ``keys`` in parts of at most
        _MAX_KEYS_PER_SCRIPT, each part's reply read by ``read`` (None: a reply of another
        shape, a BackendError).  On a cluster, per shard, where ``miss`` answers for the
        keys of a shard that failed (:meth:`ClusterStore.per_key`)."""
        conn = self._live()
        if not isinstance(conn, _Conn):
            return conn.per_key(keys, command, read, miss)
        parts = list(_ranges(len(keys), _MAX_KEYS_PER_SCRIPT))
        answers = self._run(conn, [command(conn.space, list(keys[start:end]))
                                   for start, end in parts])
        out: list[_Answer] = []
        for (start, end), answer in zip(parts, answers):
            flags = read(answer, end - start)
            if flags is None:
                raise BackendError(f"redis at {conn.where}: the {script} script answered "
                                   f"{answer!r} for {end - start} blocks")
            out += flags
        return out

    def kit_tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        """Raw access for the conformance kit (kvtier.testing.RawAccess); no hook."""
        self.ensure_open()
        conn = self._live()
        if not isinstance(conn, _Conn):
            return conn.tamper(key, transform)
        data_key = conn.data_key(key)
        (old,) = self._run(conn, [("GET", data_key)])
        if old is None:
            return False
        # raw, like bit rot: the accounted size and the recency stay as they were
        (done,) = self._run(conn, [("SET", data_key, bytes(transform(old)), "XX")])
        return bool(done)

    # operators -------------------------------------------------------------
    def _scan(self, namespace: str | None) -> Iterator[list[ScanEntry]]:
        """Blocks under ``<prefix>:<namespace>:b:``, by ``SCAN`` and one ``STRLEN`` pipeline a page.

        ``SCAN`` never blocks the server for long, and lists a key present
        throughout at least once, but may list it twice (during a rehash):
        callers count distinct keys, as the contract says.  Redis keeps no
        time of writing, so ``mtime`` is ``None``.
        """
        conn = self._live()
        if namespace is not None and not _NAMESPACE_RE.match(namespace.encode()):
            raise ConfigError(f"expected 32 lowercase hex digits, got {namespace!r}",
                              key="namespace")
        if not isinstance(conn, _Conn):
            return (
                [ScanEntry(*entry) for entry in batch]
                for batch in conn.scan(namespace, self._live)
            )
        return self._scan_conn(conn, namespace)

    def _scan_conn(self, conn: _Conn, namespace: str | None) -> Iterator[list[ScanEntry]]:
        head = f"{conn.settings.prefix}:".encode()
        pattern = _glob_escape(head) + (b"?" * 32 if namespace is None else namespace.encode())
        pattern += b":b:*"
        cursor = 0
        while True:
            self._live()
            with self._faults(conn.where, "scan"):
                cursor, names = conn.client.scan(cursor=cursor, match=pattern, count=_SCAN_COUNT)
            found: list[tuple[str, bytes, bytes]] = []
            for name in names:
                if not isinstance(name, bytes):
                    continue  # never: replies are not decoded
                ns, sep, key = name[len(head):].partition(b":b:")
                if sep and key and _NAMESPACE_RE.match(ns):
                    found.append((ns.decode(), key, name))
            if found:
                sizes = self._run(conn, [("STRLEN", name) for _, _, name in found])
                # STRLEN answers 0 for a key deleted since SCAN saw it, and for an
                # empty block: only EXISTS tells them apart, and only those need it
                empty = [i for i, size in enumerate(sizes) if not size]
                gone = set()
                if empty:
                    there = self._run(conn, [("EXISTS", found[i][2]) for i in empty])
                    gone = {i for i, flag in zip(empty, there) if not flag}
                batch = [ScanEntry(ns, key, int(size))
                         for i, ((ns, key, _), size) in enumerate(zip(found, sizes))
                         if i not in gone]
                if batch:
                    yield batch
            if int(cursor) == 0:
                return

    # internals -------------------------------------------------------------
    def _connect(self, settings: Settings, namespace: str) -> _Conn | ClusterStore:
        where = redact(settings.url)
        if settings.cluster:
            from ._cluster import ClusterStore  # redis-py's cluster client, only when asked

            return ClusterStore(settings, namespace, where)
        extra: dict[str, Any] = {}
        if settings.username is not None:
            extra["username"] = settings.username
        if settings.password is not None:
            extra["password"] = settings.password
        try:
            pool = redis.BlockingConnectionPool.from_url(
                settings.url,
                max_connections=settings.max_connections,
                timeout=settings.timeout,
                socket_timeout=settings.timeout,
                socket_connect_timeout=settings.connect_timeout,
                retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), settings.retries),
                **extra,
            )
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: {exc}", key="url") from None
        client = redis.Redis(connection_pool=pool)
        head = f"{settings.prefix}:".encode()
        if settings.pooled:  # every tenant's namespace in one pool
            space = Space.make(settings, head + b"pool:", namespace, head, settings.capacity or 0)
        else:
            base = head + f"{namespace}:".encode()
            space = Space.make(settings, base, namespace, base + b"b:", settings.capacity or 0)
        conn = _Conn(client, settings, where, space)
        try:
            with self._faults(where, "cannot open"):
                client.ping()
                for text in SCRIPTS.values():
                    client.script_load(text)
            if settings.pooled:
                wanted = settings.tenants.canonical()
                _set, stored = self._run(conn, space.rules_check(wanted))
                check_rules(wanted, stored, where)
        except BaseException:
            client.close()
            raise
        return conn

    def _live(self) -> _Conn | ClusterStore:
        conn = self._conn
        if conn is None:  # a close may have raced the call
            raise self.closed_error()
        return conn

    @contextlib.contextmanager
    def _faults(self, where: str, doing: str = "failed") -> Iterator[None]:
        try:
            yield
        except RedisError as exc:
            raise BackendError(f"redis at {where}: {doing}: {type(exc).__name__}: {exc}") from exc

    def _run(
        self,
        conn: _Conn,
        commands: Sequence[tuple[Any, ...]],
        on_answers: Callable[[list[Any]], None] | None = None,
    ) -> list[Any]:
        """Send ``commands`` in one pipeline; their answers, in order; faults as BackendError.

        ``on_answers`` sees every answer (an exception for a failed command)
        before the first failure is raised: a put whose later scripts failed
        still reports what its earlier ones evicted.  A server that lost its
        script cache (a restart, ``SCRIPT FLUSH``) answers NOSCRIPT to the
        script calls only, which did nothing: those are sent again once the
        scripts are loaded.
        """
        if not commands:
            return []
        with self._faults(conn.where):
            answers = self._pipeline(conn.client, commands)
            missing = [i for i, a in enumerate(answers) if isinstance(a, NoScriptError)]
            if missing:
                for text in SCRIPTS.values():
                    conn.client.script_load(text)
                again = self._pipeline(conn.client, [commands[i] for i in missing])
                for index, answer in zip(missing, again):
                    answers[index] = answer
            if on_answers is not None:
                on_answers(answers)
            for answer in answers:
                if isinstance(answer, Exception):
                    raise answer
        return answers

    @staticmethod
    def _pipeline(client: redis.Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        try:
            for args in commands:
                # redis-py leaves the pipeline's generic command untyped
                pipe.execute_command(*args)  # type: ignore[no-untyped-call]
            answers: list[Any] = pipe.execute(raise_on_error=False)
        finally:
            pipe.reset()
        return answers


def _glob_escape(text: bytes) -> bytes:
    """``text`` as a literal in a Redis ``MATCH`` pattern."""
    return re.sub(rb"([*?\[\]\\])", rb"\\\1", text)


def _ranges(total: int, step: int) -> Iterator[tuple[int, int]]:
    for start in range(0, total, step):
        yield start, min(start + step, total)
