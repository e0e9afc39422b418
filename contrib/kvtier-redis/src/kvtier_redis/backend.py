"""The ``redis`` backend: KV-cache blocks as Redis strings, with a byte capacity and LRU.

One tier instance serves one namespace and writes under
``<prefix>:<namespace>:``: the blocks at ``b:<key>`` (the key's bytes as they
are, Redis keys being binary-safe) and three bookkeeping keys beside them
(:mod:`kvtier_redis._scripts` describes them).  Several processes opening the
same options share one store, which is why the capacity is enforced by the
backend itself, inside Redis scripts, rather than left to Redis'
``maxmemory``: Redis counts its own overhead and would evict silently,
whereas kvtier needs a capacity counted in block bytes and every evicted
block handed to the tier below (``reports_evictions``), both of which the
conformance kit checks.

Round trips: a ``put`` is one pipeline of ``EVALSHA`` calls (one per
``batch_bytes`` of blocks), a ``get`` one pipeline of ``MGET`` and the
recency update, a ``lookup`` one pipeline of ``EXISTS``, an ``evict`` one
script.  Large blocks go to the socket from the caller's buffers, uncopied
(redis-py sends big arguments as they are).  ``kvtier_put_parts`` and
``kvtier_get_into`` are left out: a Redis argument is one buffer and redis-py
materialises each reply as ``bytes``, so neither would save a copy.

With ``cluster: true`` the hooks go to :class:`kvtier_redis._cluster.ClusterStore`
instead: the namespace split into hash-tagged shards on a Redis Cluster.
"""

from __future__ import annotations

import contextlib
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, MutableSequence, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import NoScriptError, RedisError
from redis.retry import Retry

from kvtier.config.units import parse_duration, parse_size
from kvtier.spec import (
    BackendError,
    BytesLike,
    Capabilities,
    ClosedError,
    ConfigError,
    KvtierError,
    Option,
    ScanEntry,
    hookimpl,
)

from . import _scripts

if TYPE_CHECKING:
    from ._cluster import ClusterStore

__all__ = ["REDIS_MAX_STRING", "RedisBackend"]

#: Largest string value Redis stores (its ``proto-max-bulk-len`` default).
REDIS_MAX_STRING = 512 * 1024 * 1024
#: Blocks per put script at most: a script blocks the server while it runs.
_MAX_KEYS_PER_SCRIPT = 1024
_SCHEMES = ("redis", "rediss", "unix")
#: Keys a SCAN call asks Redis to look at (a hint: it may answer more or fewer).
_SCAN_COUNT = 1000
_NAMESPACE_RE = re.compile(rb"^[0-9a-f]{32}$")

Evicted = MutableSequence[tuple[bytes, BytesLike]]


def _check_url(value: Any) -> None:
    scheme = urllib.parse.urlsplit(str(value)).scheme
    if scheme not in _SCHEMES:
        raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got scheme {scheme!r}")


def _check_prefix(value: Any) -> None:
    if not str(value):
        raise ValueError("must not be empty: it keeps kvtier's keys apart from others'")


def _at_least(least: int) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value < least:
            raise ValueError(f"must be at least {least}, got {value}")

    return check


def _check_max_block_size(value: Any) -> None:
    if not 0 < int(value) <= REDIS_MAX_STRING:
        raise ValueError(f"must be between 1 byte and 512MiB (Redis' largest string), got {value}")


_OPTIONS: Mapping[str, Option] = {
    "url": Option(
        "str",
        "Redis server: redis://host:port/db, rediss://host:port/db (TLS) or "
        "unix:///path/redis.sock?db=N. Put the password in `password`, not here.",
        default="redis://127.0.0.1:6379/0",
        check=_check_url,
    ),
    "prefix": Option(
        "str",
        "First part of every Redis key this tier writes: <prefix>:<namespace>:...",
        default="kvtier",
        check=_check_prefix,
    ),
    "capacity": Option(
        "size",
        "Bytes of blocks held per namespace (sum of block sizes), e.g. 4GiB; the least "
        "recently used blocks are evicted and handed to the tier below. Unset: unbounded.",
        default=None,
        check=_at_least(1),
    ),
    "max_block_size": Option(
        "size", "Refuse larger blocks (Redis strings hold at most 512MiB).", default="512MiB",
        check=_check_max_block_size,
    ),
    "username": Option("str", "ACL user name (Redis 6 and later).", default=None),
    "password": Option(
        "str", "Password for AUTH; use ${REDIS_PASSWORD} in YAML.", default=None, secret=True
    ),
    "connect_timeout": Option("duration", "Give up connecting after this long.", default="5s"),
    "timeout": Option(
        "duration", "Give up on one batch after this long (also the wait for a free connection).",
        default="30s",
    ),
    "retries": Option(
        "int", "Resend a batch after a connection error or timeout this many times.", default=1,
        check=_at_least(0),
    ),
    "max_connections": Option(
        "int", "Connections to Redis at most; threads beyond wait for a free one.", default=16,
        check=_at_least(1),
    ),
    "batch_bytes": Option(
        "size", "Block bytes per put script; larger puts are split, still one round trip.",
        default="64MiB",
        check=_at_least(1),
    ),
    "cluster": Option(
        "bool", "The url names a node of a Redis (or Valkey) Cluster; the namespace is "
        "split into hash-tagged shards spread over the masters.", default=False,
    ),
    "shards": Option(
        "int", "Shards of a new namespace (cluster only; the capacity is split evenly "
        "between them). Unset: 16 for a new namespace, the stored count for an existing one.",
        default=None,
        check=_at_least(1),
    ),
}


def redact(url: str) -> str:
    """``url`` without its user name and password, for messages."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, ""))


def _read(options: Mapping[str, Any], name: str) -> Any:
    """Option ``name`` parsed to its type and checked, the default if unset; None if neither."""
    option = _OPTIONS[name]
    value = options.get(name)
    if value is None:
        value = option.default
    if value is None:
        return None
    try:
        if option.type == "size":
            value = parse_size(value)
        elif option.type == "duration":
            value = parse_duration(value)
        elif option.type == "int" and not isinstance(value, int):
            value = int(value)
        if option.check is not None:
            option.check(value)
    except (TypeError, ValueError) as exc:
        reason = "rejected (value hidden: secret option)" if option.secret else str(exc)
        raise ConfigError(reason, key=name) from None
    return value


def _read_text(options: Mapping[str, Any], name: str) -> str | None:
    value = _read(options, name)
    return None if value is None else str(value)


def _read_count(options: Mapping[str, Any], name: str, *, least: int) -> int:
    value = _read(options, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"must be an integer of at least {least}, got {value!r}", key=name)
    return value


def _read_flag(options: Mapping[str, Any], name: str) -> bool:
    value = _read(options, name)
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    if not isinstance(value, bool):
        raise ConfigError(f"must be true or false, got {value!r}", key=name)
    return value


@dataclass(frozen=True)
class _Settings:
    url: str
    prefix: str
    capacity: int | None
    max_block_size: int
    username: str | None
    password: str | None
    connect_timeout: float
    timeout: float
    retries: int
    max_connections: int
    batch_bytes: int
    cluster: bool = False
    shards: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> _Settings:
        """Validate ``options`` (parsed by kvtier already, or raw when called directly)."""
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ConfigError(
                f"is not an option of the redis backend ({', '.join(_OPTIONS)})", key=unknown[0]
            )
        settings = cls(
            url=str(_read(options, "url")),
            prefix=str(_read(options, "prefix")),
            capacity=(
                None if _read(options, "capacity") is None
                else _read_count(options, "capacity", least=1)
            ),
            max_block_size=_read_count(options, "max_block_size", least=1),
            username=_read_text(options, "username"),
            password=_read_text(options, "password"),
            connect_timeout=float(_read(options, "connect_timeout")),
            timeout=float(_read(options, "timeout")),
            retries=_read_count(options, "retries", least=0),
            max_connections=_read_count(options, "max_connections", least=1),
            batch_bytes=_read_count(options, "batch_bytes", least=1),
            cluster=_read_flag(options, "cluster"),
            shards=(
                None if _read(options, "shards") is None
                else _read_count(options, "shards", least=1)
            ),
        )
        if settings.shards is not None and not settings.cluster:
            raise ConfigError("applies to a cluster only (cluster: true)", key="shards")
        url = urllib.parse.urlsplit(settings.url)
        if url.password is not None and settings.password is not None:
            raise ConfigError("a password is given in the url and as an option", key="password")
        if url.username and settings.username is not None:
            raise ConfigError("a user is given in the url and as an option", key="username")
        return settings

    @property
    def limit(self) -> int:
        """Largest block stored: a block over the capacity could never fit."""
        if self.capacity is None:
            return self.max_block_size
        return min(self.capacity, self.max_block_size)


@dataclass(frozen=True)
class _Conn:
    """What an open instance holds; swapped for None on close."""

    client: redis.Redis
    settings: _Settings
    where: str  # the URL without credentials
    keys: tuple[bytes, bytes, bytes]  # recency index, sizes, counters
    data_prefix: bytes

    def data_key(self, key: bytes) -> bytes:
        return self.data_prefix + key


_SCRIPTS = {_scripts.sha1(text): text for text in (_scripts.PUT, _scripts.EVICT, _scripts.TOUCH)}
_PUT, _EVICT, _TOUCH = (_scripts.sha1(s) for s in (_scripts.PUT, _scripts.EVICT, _scripts.TOUCH))


def _as_buffer(block: BytesLike) -> bytes | bytearray | memoryview:
    # redis-py frames an argument by len(), which counts items, not bytes,
    # in a memoryview of another format or shape
    if isinstance(block, memoryview) and (block.format != "B" or block.ndim != 1):
        return block.cast("B")
    buffer: bytes | bytearray | memoryview = block
    return buffer


def _nbytes(block: bytes | bytearray | memoryview) -> int:
    return block.nbytes if isinstance(block, memoryview) else len(block)


def _check_batch(keys: Sequence[bytes], other: Sequence[object]) -> None:
    if len(keys) != len(other):
        raise ValueError(f"batch of {len(keys)} keys but {len(other)} blocks")


class RedisBackend:
    """A Redis tier; see the module docstring and contrib/kvtier-redis/README.md."""

    def __init__(self) -> None:
        # kvtier also instantiates to read options: no connection here
        self._lock = threading.Lock()
        self._conn: _Conn | ClusterStore | None = None
        self._closed = False

    # lifecycle -------------------------------------------------------------
    @hookimpl
    def kvtier_options(self) -> dict[str, Option]:
        return dict(_OPTIONS)

    @hookimpl
    def kvtier_open(self, options: Mapping[str, Any], namespace: str) -> None:
        settings = _Settings.parse(options)
        with self._lock:
            if self._closed:
                raise ClosedError("redis backend is closed")
            if self._conn is not None:
                raise KvtierError("redis backend is already open")
            self._conn = self._connect(settings, namespace)

    @hookimpl
    def kvtier_capabilities(self) -> Capabilities:
        with self._lock:
            if self._closed:
                raise ClosedError("redis backend is closed")
            conn = self._conn
        # unopened (`kvtier backends`): the defaults, without I/O
        settings = _Settings.parse({}) if conn is None else conn.settings
        extra = {"eviction": "lru", "capacity_scope": "namespace"}
        max_block_size = settings.max_block_size
        if not isinstance(conn, _Conn) and conn is not None:
            # a block must fit in its shard's share of the capacity
            max_block_size = conn.limit
            extra.update(capacity_scope="shard", shards=str(conn.shards))
        return Capabilities(
            # blocks outlive the instance (and any one client process) on the
            # server; surviving a server restart is Redis' own persistence setting
            persistent=True,
            shared=True,
            thread_safe=True,
            max_block_size=max_block_size,
            capacity=settings.capacity,
            reports_evictions=True,
            extra=extra,
        )

    @hookimpl
    def kvtier_stats(self) -> dict[str, int]:
        conn = self._live()
        if not isinstance(conn, _Conn):
            stats = conn.stats()  # summed over the shards
        else:
            lru, _sizes, meta = conn.keys
            (used, evictions), blocks = self._run(
                conn, [("HMGET", meta, "used", "evictions"), ("ZCARD", lru)]
            )
            stats = {
                "used_bytes": int(used or 0),
                "blocks": int(blocks),
                "evictions": int(evictions or 0),
            }
        if conn.settings.capacity is not None:
            stats["capacity_bytes"] = conn.settings.capacity
        return stats

    @hookimpl
    def kvtier_close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            self._closed = True
        if isinstance(conn, _Conn):
            # every write was acknowledged by the server before its hook
            # returned, so closing loses nothing
            with contextlib.suppress(RedisError, OSError):
                conn.client.close()
        elif conn is not None:
            conn.close()

    # data path -------------------------------------------------------------
    @hookimpl
    def kvtier_put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> list[bool]:
        _check_batch(keys, blocks)
        conn = self._live()
        if not isinstance(conn, _Conn):
            return conn.put(keys, blocks, evicted)
        settings = conn.settings
        buffers = [_as_buffer(block) for block in blocks]
        stored = [False] * len(keys)
        chunks: list[list[int]] = []
        chunk: list[int] = []
        chunk_bytes = 0
        for index, buffer in enumerate(buffers):
            size = _nbytes(buffer)
            if size > settings.limit:
                continue  # refused, which is not an error
            stored[index] = True
            if chunk and (
                chunk_bytes + size > settings.batch_bytes or len(chunk) >= _MAX_KEYS_PER_SCRIPT
            ):
                chunks.append(chunk)
                chunk, chunk_bytes = [], 0
            chunk.append(index)
            chunk_bytes += size
        if chunk:
            chunks.append(chunk)
        commands = []
        for part in chunks:
            args: list[Any] = [settings.capacity or 0, conn.data_prefix]
            for index in part:
                args += (keys[index], buffers[index])
            commands.append(self._script(conn, _PUT, [conn.data_key(keys[i]) for i in part], args))

        def report(answers: list[Any]) -> None:
            for pairs in answers:
                if isinstance(pairs, list):
                    evicted.extend(zip(pairs[0::2], pairs[1::2]))

        self._run(conn, commands, report)
        return stored

    @hookimpl
    def kvtier_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        conn = self._live()
        if not keys:
            return []
        if not isinstance(conn, _Conn):
            return conn.get(keys)
        commands: list[tuple[Any, ...]] = [("MGET", *(conn.data_key(k) for k in keys))]
        if conn.settings.capacity is not None:
            # recency only matters where something is evicted
            lru, _sizes, meta = conn.keys
            commands.append(("EVALSHA", _TOUCH, 2, lru, meta, *keys))
        found: list[bytes | None] = self._run(conn, commands)[0]
        return found

    @hookimpl
    def kvtier_lookup(self, keys: Sequence[bytes]) -> list[bool]:
        conn = self._live()
        if not isinstance(conn, _Conn):
            return conn.lookup(keys)
        # one EXISTS per key: EXISTS of several keys answers a count, not which
        answers = self._run(conn, [("EXISTS", conn.data_key(k)) for k in keys])
        return [bool(answer) for answer in answers]

    @hookimpl
    def kvtier_evict(self, keys: Sequence[bytes]) -> list[bool]:
        conn = self._live()
        if not isinstance(conn, _Conn):
            return conn.evict(keys)
        commands = [
            self._script(conn, _EVICT, [conn.data_key(k) for k in keys[start:end]], keys[start:end])
            for start, end in _ranges(len(keys), _MAX_KEYS_PER_SCRIPT)
        ]
        return [bool(flag) for flags in self._run(conn, commands) for flag in flags]

    @hookimpl
    def kvtier_tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
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
    @hookimpl
    def kvtier_scan(self, namespace: str | None) -> Iterator[list[ScanEntry]]:
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
        return self._scan(conn, namespace)

    def _scan(self, conn: _Conn, namespace: str | None) -> Iterator[list[ScanEntry]]:
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
    def _connect(self, settings: _Settings, namespace: str) -> _Conn | ClusterStore:
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
        base = f"{settings.prefix}:{namespace}:".encode()
        conn = _Conn(client, settings, where, (base + b"lru", base + b"size", base + b"meta"),
                     base + b"b:")
        try:
            with self._faults(where, "cannot open"):
                client.ping()
                for text in _SCRIPTS.values():
                    client.script_load(text)
        except BaseException:
            client.close()
            raise
        return conn

    def _live(self) -> _Conn | ClusterStore:
        conn = self._conn
        if conn is None:
            raise ClosedError(f"redis backend is {'closed' if self._closed else 'not open'}")
        return conn

    @staticmethod
    def _script(
        conn: _Conn, sha: str, data_keys: Sequence[bytes], args: Sequence[Any]
    ) -> tuple[Any, ...]:
        return ("EVALSHA", sha, 3 + len(data_keys), *conn.keys, *data_keys, *args)

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
                for text in _SCRIPTS.values():
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
