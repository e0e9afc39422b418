"""The ``redis`` backend on a Redis (or Valkey) Cluster: ``cluster: true``.

A namespace is split into a fixed number of shards, each a hash tag
``{<namespace>:<s>}`` in its keys, so every key of a shard lives in one slot
and the Lua scripts of :mod:`kvtier_redis._scripts` run on one node, exactly
as they do on a single server: each shard keeps its own byte count, recency
index and counters, and a block's shard is ``crc32(key) % shards``.  The
capacity is split evenly, ``capacity // shards`` bytes per shard, evicted LRU
within the shard.  With ``tenants``, the shards are the pool's, ``{pool:<s>}``,
shared by every namespace under the prefix, and each tenant's quota is split
evenly too: ``quota // shards`` bytes per shard, so a tenant holds at most its
quota in all (README.md, "Tenants on a cluster"); its retention budget (``keep``)
likewise, ``keep // shards`` kept bytes per shard.  The shard count is fixed
when the namespace (or pool) is first opened and stored in the cluster
(``<prefix>:{<namespace>}:shards``, ``<prefix>:{pool}:shards``), because
changing it would move every block to another shard.

Routing, redirections and topology are redis-py's :class:`RedisCluster`: a
batch is split by the node that owns each shard's slot, each node's commands
go as one :class:`ClusterPipeline` addressed to that node, and the pipelines
of different nodes run in parallel threads.  redis-py follows ``MOVED`` and
``ASK``, waits out ``TRYAGAIN`` and ``CLUSTERDOWN`` and refreshes the slot
map; what still fails after its retries is a miss (``get``, ``lookup``), a
block not stored (``put``) or not removed (``evict``) for the shards
concerned.  Only a call of which no part got through raises
:class:`~kvtier.spec.BackendError`, so the chain backs off a cluster that is
down, not one that is failing over a third of its slots.  An answer is only
ever matched to the command that asked for it: a reply of the wrong shape
is a miss, never another key's bytes.
"""

from __future__ import annotations

import contextlib
import re
import urllib.parse
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from redis import BlockingConnectionPool
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError
from redis.retry import Retry

from kvtier.spec import BackendError, BytesLike, ConfigError, Failed

from ._space import EVICT, SCRIPTS, STATS, TOUCH, Space, add_stats, check_rules, stats_of

#: What a shard answers when its commands did not get through.
ShardFailure = Failed[BaseException]

if TYPE_CHECKING:
    from kvtier.spec.base import Evicted

    from ._settings import Settings

__all__ = ["DEFAULT_SHARDS", "ClusterStore"]

#: Shards of a new namespace unless ``shards`` says otherwise: enough to
#: spread one namespace over 16 masters, few enough that each shard of a
#: small capacity still holds large blocks.
DEFAULT_SHARDS = 16
#: Blocks per put script at most: a script blocks its node while it runs.
_MAX_KEYS_PER_SCRIPT = 1024

#: A data key after ``<prefix>:{``: namespace, shard, the block's key.
_DATA_NAME = re.compile(rb"([0-9a-f]{32}):[0-9]+\}:b:(.+)", re.DOTALL)
#: A pool's data key after ``<prefix>:{``: shard, namespace, the block's key.
_POOL_DATA_NAME = re.compile(rb"pool:[0-9]+\}:([0-9a-f]{32}):b:(.+)", re.DOTALL)
_SCAN_COUNT = 1000

Command = tuple[Any, ...]
#: What a per-shard script answers for one key: removed, kept, set (None: not held),
#: seconds left.
_Flag = TypeVar("_Flag")


def _removed_flags(answer: Any, count: int) -> list[bool] | None:
    """What ``EVICT`` answers for ``count`` members, one 1 / 0 each; None for a reply
    of another shape."""
    if not isinstance(answer, list) or len(answer) != count:
        return None
    return [bool(flag) for flag in answer]


def _buffer(block: BytesLike) -> bytes | bytearray | memoryview:
    if isinstance(block, memoryview) and (block.format != "B" or block.ndim != 1):
        return block.cast("B")
    buffer: bytes | bytearray | memoryview = block
    return buffer


def _size(block: bytes | bytearray | memoryview) -> int:
    return block.nbytes if isinstance(block, memoryview) else len(block)


def _cluster_client(settings: Settings, where: str) -> RedisCluster:
    url = urllib.parse.urlsplit(settings.url)
    if url.scheme == "unix":
        raise ConfigError("a cluster is reached over TCP: use redis:// or rediss://", key="url")
    if url.path.strip("/") not in ("", "0"):
        raise ConfigError("a cluster has database 0 only", key="url")
    extra: dict[str, Any] = {}
    if settings.username is not None:
        extra["username"] = settings.username
    if settings.password is not None:
        extra["password"] = settings.password
    try:
        return RedisCluster.from_url(
            urllib.parse.urlunsplit(url._replace(path="")),
            connection_pool_class=BlockingConnectionPool,
            max_connections=settings.max_connections,
            timeout=settings.timeout,
            socket_timeout=settings.timeout,
            socket_connect_timeout=settings.connect_timeout,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), settings.retries),
            require_full_coverage=True,
            **extra,
        )
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}", key="url") from None
    except RedisClusterException as exc:
        raise _open_error(where, exc) from None
    except RedisError as exc:
        raise BackendError(f"redis cluster at {where}: cannot open: {exc}") from exc


def _open_error(where: str, exc: RedisClusterException) -> Exception:
    text = str(exc)
    if "not enabled" in text.lower():
        return ConfigError(
            f"{where} is a Redis server without cluster mode: set cluster: false, "
            "or name a node of a cluster", key="cluster",
        )
    if "slots are not covered" in text.lower() or "not covered" in text.lower():
        return BackendError(
            f"redis cluster at {where}: some of the 16384 slots have no master "
            "(a master down without a replica, or slots never assigned): {text}"
        )
    return BackendError(f"redis cluster at {where}: no node reachable: {text}")


class ClusterStore:
    """One namespace on a cluster; the backend's hooks call these methods."""

    def __init__(self, settings: Settings, namespace: str, where: str) -> None:
        if "{" in settings.prefix or "}" in settings.prefix:
            raise ConfigError("must not contain { or }: the shard is the key's hash tag",
                              key="prefix")
        self.settings = settings
        self.where = where
        self.client = _cluster_client(settings, where)
        # the shards' hash tags: the namespace's, or the pool's with tenants
        tag = "pool" if settings.pooled else namespace
        try:
            self.shards = self._shard_count(tag, namespace)
            base = f"{settings.prefix}:{{{tag}:"
            capacity = self.shard_capacity
            self._shards = [
                Space.make(settings, f"{base}{s}}}:".encode(), namespace,
                           f"{base}{s}}}:".encode() + (b"" if settings.pooled else b"b:"),
                           capacity, self.shards)
                for s in range(self.shards)
            ]
            self._slots = [key_slot(s.keys[0]) for s in self._shards]
            self._load_scripts()
        except BaseException:
            self.client.close()
            raise
        self._pool = ThreadPoolExecutor(
            max_workers=min(32, settings.max_connections), thread_name_prefix="kvtier-redis"
        )
        if settings.pooled:
            try:
                self._check_rules()
            except BaseException:
                self.close()
                raise

    # what the backend declares --------------------------------------------
    @property
    def shard_capacity(self) -> int:
        """Bytes per shard (0: unbounded)."""
        return (self.settings.capacity or 0) // self.shards

    @property
    def limit(self) -> int:
        """Largest block stored: one must fit in its shard's share of the capacity."""
        if self.settings.capacity is None:
            return self.settings.max_block_size
        return min(self.settings.max_block_size, self.shard_capacity)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        with contextlib.suppress(RedisError, OSError):
            self.client.close()

    # hooks ------------------------------------------------------------------
    def put(
        self, keys: Sequence[bytes], blocks: Sequence[BytesLike], evicted: Evicted
    ) -> list[bool]:
        buffers = [_buffer(block) for block in blocks]
        limit = self.limit
        by_shard: dict[int, list[int]] = {}
        too_large: dict[int, int] = {}
        for index, buffer in enumerate(buffers):
            s = self._shard_of(keys[index])
            if _size(buffer) <= limit:
                by_shard.setdefault(s, []).append(index)
            else:  # refused, and counted in its shard
                too_large[s] = too_large.get(s, 0) + 1
        commands: dict[int, list[Command]] = {}
        parts: dict[int, list[list[int]]] = {}
        for s, indices in by_shard.items():
            parts[s] = list(self._chunks(indices, buffers))
            shard = self._shards[s]
            commands[s] = [shard.put([keys[i] for i in part], [buffers[i] for i in part])
                           for part in parts[s]]
        for s, count in too_large.items():
            commands.setdefault(s, []).append(
                self._shards[s].refused(self.settings.tenant, count))
        stored = [False] * len(keys)
        answers = self._execute(commands)
        for s, shard_answers in answers.items():
            if isinstance(shard_answers, Failed):
                continue
            for part, answer in zip(parts.get(s, []), shard_answers):
                if isinstance(answer, list) and len(answer) == 2:
                    flags, pairs = answer
                    evicted.extend(zip(pairs[0::2], pairs[1::2]))
                    for index, flag in zip(part, flags):
                        stored[index] = bool(flag)
        self._raise_if_all_failed(answers)
        return stored

    def get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        by_shard = self._by_shard(keys)
        commands: dict[int, list[Command]] = {}
        for s, indices in by_shard.items():
            shard = self._shards[s]
            commands[s] = [("MGET", *(shard.data_key(keys[i]) for i in indices))]
            settings = self.settings
            if settings.capacity is not None or settings.pooled or settings.expire:
                commands[s].append(shard.members(TOUCH, [keys[i] for i in indices]))
        found: list[bytes | None] = [None] * len(keys)
        answers = self._execute(commands)
        for s, shard_answers in answers.items():
            if isinstance(shard_answers, Failed):
                continue
            blocks = shard_answers[0]  # a failed TOUCH loses recency, not blocks
            # anything but one reply per key asked is a miss, never a guess
            if isinstance(blocks, list) and len(blocks) == len(by_shard[s]):
                for index, block in zip(by_shard[s], blocks):
                    found[index] = block if isinstance(block, bytes) else None
        self._raise_if_all_failed(answers)
        return found

    def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        by_shard = self._by_shard(keys)
        commands = {
            s: [("EXISTS", self._shards[s].data_key(keys[i])) for i in indices]
            for s, indices in by_shard.items()
        }
        present = [False] * len(keys)
        answers = self._execute(commands)
        for s, shard_answers in answers.items():
            if not isinstance(shard_answers, Failed):
                for index, answer in zip(by_shard[s], shard_answers):
                    present[index] = type(answer) is int and answer > 0
        self._raise_if_all_failed(answers)
        return present

    def evict(self, keys: Sequence[bytes]) -> list[bool]:
        return self.per_key(
            keys, lambda shard, part: shard.members(EVICT, part), _removed_flags, False)

    def per_key(
        self, keys: Sequence[bytes], command: Callable[[Space, list[bytes]], Command],
        read: Callable[[Any, int], Sequence[_Flag] | None], miss: _Flag,
    ) -> list[_Flag]:
        """One answer per key from a script run on each shard over its keys (evict; keep,
        expire and deadlines, whose marks and deadlines each shard holds for its own
        blocks), in parts of at most _MAX_KEYS_PER_SCRIPT, each part's answer read by
        ``read`` (None for a reply of another shape); a key of a failed shard or such a
        reply gets ``miss``."""
        by_shard = self._by_shard(keys)
        commands: dict[int, list[Command]] = {}
        parts: dict[int, list[list[int]]] = {}
        for s, indices in by_shard.items():
            shard = self._shards[s]
            parts[s] = [indices[i:i + _MAX_KEYS_PER_SCRIPT]
                        for i in range(0, len(indices), _MAX_KEYS_PER_SCRIPT)]
            commands[s] = [command(shard, [keys[i] for i in part]) for part in parts[s]]
        out: list[_Flag] = [miss] * len(keys)
        answers = self._execute(commands)
        for s, shard_answers in answers.items():
            if isinstance(shard_answers, Failed):
                continue
            for part, answer in zip(parts[s], shard_answers):
                flags = read(answer, len(part))
                for index, flag in zip(part, flags or ()):
                    out[index] = flag
        self._raise_if_all_failed(answers)
        return out

    def stats(self) -> dict[str, int]:
        commands: dict[int, list[Command]] = {
            s: [shard.call(STATS)] for s, shard in enumerate(self._shards)
        }
        total = {"used_bytes": 0, "blocks": 0, "evictions": 0}
        for shard_answers in self._execute(commands).values():
            if isinstance(shard_answers, Failed):
                raise self._fault(shard_answers.exc)
            error = next((a for a in shard_answers if isinstance(a, Exception)), None)
            if error is not None:
                raise self._fault(error)
            add_stats(total, stats_of(shard_answers[0], self.settings.tenant))
        return total

    def tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        data_key = self._shards[self._shard_of(key)].data_key(key)
        with self._faults():
            old: Any = self.client.get(data_key)
            if old is None:
                return False
            return bool(self.client.set(data_key, bytes(transform(old)), xx=True))

    def scan(
        self, namespace: str | None, check: Callable[[], object]
    ) -> Iterator[list[tuple[str, bytes, int]]]:
        """``(namespace, key, size)`` batches: ``SCAN`` on every master, a page at a time.

        Keys live on the master owning their shard's slot, so each master is
        scanned in turn, and the sizes of a page are one ``STRLEN`` pipeline
        to that master.  ``check`` raises once the instance is closed.  A
        master failing over mid-scan is a fault, raised, not a short listing.
        """
        head = f"{self.settings.prefix}:{{".encode()
        pattern = re.sub(rb"([*?\[\]\\])", rb"\\\1", head)
        wanted = b"?" * 32 if namespace is None else namespace.encode()
        data_name = _DATA_NAME
        if self.settings.pooled:  # <prefix>:{pool:<s>}:<namespace>:b:<key>
            pattern += b"pool:*}:" + wanted + b":b:*"
            data_name = _POOL_DATA_NAME
        else:
            pattern += wanted + b":*}:b:*"
        with self._faults("scan"):
            masters: list[ClusterNode] = self.client.get_primaries()  # type: ignore[no-untyped-call]
        for master in masters:
            cursor = 0
            while True:
                check()
                with self._faults("scan"):
                    node = self.client.get_redis_connection(master)
                    cursor, names = node.scan(cursor=cursor, match=pattern, count=_SCAN_COUNT)
                    found = [(m.group(1).decode(), m.group(2), name) for name in names
                             if isinstance(name, bytes)  # replies are not decoded
                             and (m := data_name.fullmatch(name[len(head):]))]
                    batch = self._sized(node, found)
                if batch:
                    yield batch
                if int(cursor) == 0:
                    break

    @staticmethod
    def _sized(node: Any, found: list[tuple[str, bytes, bytes]]) -> list[tuple[str, bytes, int]]:
        """Each found block with its length; blocks deleted since SCAN saw them are left out."""
        if not found:
            return []
        pipe = node.pipeline(transaction=False)
        for _, _, name in found:
            pipe.strlen(name)
            pipe.exists(name)  # STRLEN is 0 for a deleted key and for an empty block
        replies = pipe.execute()
        return [(ns, key, int(size)) for (ns, key, _), size, there
                in zip(found, replies[0::2], replies[1::2]) if there]

    # internals --------------------------------------------------------------
    def _shard_count(self, tag: str, namespace: str) -> int:
        """The stored shard count of ``tag`` (the namespace, or the pool); the configured
        (or default) one if it is new."""
        key = f"{self.settings.prefix}:{{{tag}}}:shards"
        wanted = self.settings.shards
        with self._faults("cannot open"):
            self.client.set(key, wanted or DEFAULT_SHARDS, nx=True)
            stored: Any = self.client.get(key)
        try:
            count = int(stored)
        except (TypeError, ValueError):
            raise BackendError(f"redis cluster at {self.where}: {key} holds {stored!r}, "
                               "not a shard count") from None
        if wanted is not None and wanted != count:
            raise ConfigError(
                f"is {wanted}, but {'the pool' if tag == 'pool' else 'namespace ' + namespace} "
                f"was created with {count} shards "
                "(the count is fixed for a namespace's life): set shards to "
                f"{count} or leave it unset", key="shards",
            )
        return count

    def _load_scripts(self) -> None:
        """Load the scripts on every master that answers (NOSCRIPT is handled anyway)."""
        for node in self.client.get_primaries():  # type: ignore[no-untyped-call]
            with contextlib.suppress(RedisError, OSError):
                redis_node = self.client.get_redis_connection(node)
                for text in SCRIPTS.values():
                    redis_node.script_load(text)

    def _shard_of(self, key: bytes) -> int:
        return zlib.crc32(key) % self.shards

    def _by_shard(self, keys: Sequence[bytes]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for index, key in enumerate(keys):
            groups.setdefault(self._shard_of(key), []).append(index)
        return groups

    def _chunks(self, indices: list[int], buffers: Sequence[Any]) -> Iterator[list[int]]:
        chunk: list[int] = []
        chunk_bytes = 0
        for index in indices:
            size = _size(buffers[index])
            if chunk and (chunk_bytes + size > self.settings.batch_bytes
                          or len(chunk) >= _MAX_KEYS_PER_SCRIPT):
                yield chunk
                chunk, chunk_bytes = [], 0
            chunk.append(index)
            chunk_bytes += size
        if chunk:
            yield chunk

    def _check_rules(self) -> None:
        """Every shard records the first opener's ``tenants`` rules; others are refused."""
        wanted = self.settings.tenants.canonical()
        commands = {s: shard.rules_check(wanted) for s, shard in enumerate(self._shards)}
        for shard_answers in self._execute(commands).values():
            if isinstance(shard_answers, Failed):
                raise self._fault(shard_answers.exc, "cannot open")
            error = next((a for a in shard_answers if isinstance(a, Exception)), None)
            if error is not None:
                raise self._fault(error, "cannot open")
            check_rules(wanted, shard_answers[1], self.where)

    def _execute(self, commands: dict[int, list[Command]]) -> dict[int, list[Any] | ShardFailure]:
        """Each shard's answers (per command, exceptions included), or Failed for the shard.

        Shards are grouped by the node owning their slot now; each node gets
        one pipeline, and the nodes' pipelines run in parallel.
        """
        by_node: dict[str, tuple[ClusterNode, list[int]]] = {}
        answers: dict[int, list[Any] | ShardFailure] = {}
        for s in commands:
            try:
                node = self.client.nodes_manager.get_node_from_slot(self._slots[s])
            except (RedisError, RedisClusterException, IndexError) as exc:
                answers[s] = Failed(exc)
                continue
            by_node.setdefault(node.name, (node, []))[1].append(s)
        work = list(by_node.values())
        if len(work) == 1:
            results = [self._node_pipeline(commands, *work[0])]
        else:
            results = list(self._pool.map(lambda w: self._node_pipeline(commands, *w), work))
        for result in results:
            answers.update(result)
        return answers

    def _node_pipeline(
        self, commands: dict[int, list[Command]], node: ClusterNode, shards: list[int]
    ) -> dict[int, list[Any] | ShardFailure]:
        flat = [command for s in shards for command in commands[s]]
        try:
            replies = self._send(flat, node)
            missing = [i for i, a in enumerate(replies) if isinstance(a, NoScriptError)]
            if missing:
                # a promoted replica or a restarted master without our scripts
                self._load_scripts()
                for index, reply in zip(missing, self._send([flat[i] for i in missing], node)):
                    replies[index] = reply
        except (RedisError, RedisClusterException, OSError) as exc:
            return {s: Failed(exc) for s in shards}
        out: dict[int, list[Any] | ShardFailure] = {}
        at = 0
        for s in shards:
            out[s] = replies[at:at + len(commands[s])]
            at += len(commands[s])
        return out

    def _send(self, commands: Sequence[Command], node: ClusterNode) -> list[Any]:
        pipe = self.client.pipeline()  # type: ignore[no-untyped-call]
        try:
            for args in commands:
                pipe.execute_command(*args, target_nodes=node)
            replies: list[Any] = pipe.execute(raise_on_error=False)
        finally:
            pipe.reset()
        return replies

    def _raise_if_all_failed(self, answers: dict[int, list[Any] | ShardFailure]) -> None:
        """BackendError if no command of the call got through, naming the first error."""
        errors: list[BaseException] = []
        for shard_answers in answers.values():
            if isinstance(shard_answers, Failed):
                errors.append(shard_answers.exc)
            elif all(isinstance(a, Exception) for a in shard_answers):
                errors.extend(a for a in shard_answers if isinstance(a, Exception))
            else:
                return
        if errors:
            raise self._fault(errors[0])

    def _fault(self, error: BaseException, doing: str = "failed") -> BackendError:
        kind = "refused" if isinstance(error, ResponseError) else type(error).__name__
        return BackendError(f"redis cluster at {self.where}: {doing}: {kind}: {error}")

    @contextlib.contextmanager
    def _faults(self, doing: str = "failed") -> Iterator[None]:
        try:
            yield
        except (RedisError, RedisClusterException) as exc:
            raise self._fault(exc, doing) from exc
