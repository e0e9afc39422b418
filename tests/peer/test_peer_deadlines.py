"""Deadlines read through a ``peer`` tier: DEADLINES asks the tiers of a real ``kvtier serve``.

The server's chain is RAM written through to a real ``redis-server`` (a tier
that records its blocks' deadlines on the server, :mod:`kvtier_redis`).  One
client gives a block a deadline (EXPIRE), and another client, on a connection
of its own, reads it back (DEADLINES): the earliest deadline among the
server's tiers that hold the block, none for a block without one, and none
for the same key in another namespace.  A server of before DEADLINES (its
WELCOME lists KEEP, RELEASE and EXPIRE only) is sent none: the client answers
None for every key, and its connection stays up.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peer_server
import pytest
from peer_chain import backend_of, block, chain_of, key, peer_tier, read
from peer_server import PeerServer
from redis_server import RedisServer

from kvtier import Namespace
from kvtier.plugins.registry import BackendRegistry

SIZE = 4096
#: The deadline given, in seconds: far off, so a slow machine reads it with time left.
FAR = 600.0
OTHER = Namespace("peer-test-other", dtype="bfloat16", tokens_per_block=16)
#: The server of before DEADLINES: KEEP, RELEASE and EXPIRE in its WELCOME, and a
#: request of another type is an unknown message, which would close the connection.
OLD_SERVE = [sys.executable, "-c",
             "import kvtier.peer.protocol as pp; "
             "pp.OPTIONAL = frozenset({pp.KEEP, pp.RELEASE, pp.EXPIRE}); "
             "pp.REQUESTS = frozenset({pp.GET, pp.PUT, pp.LOOKUP, pp.EVICT, pp.STATS}) "
             "| pp.OPTIONAL; from kvtier.peer.server import serve_command; serve_command()"]


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


def redis_tier(redis: RedisServer, prefix: str) -> dict[str, Any]:
    return {"name": "redis", "backend": "redis", "url": redis.url(0), "prefix": prefix}


def node_config(redis: RedisServer, prefix: str) -> dict[str, Any]:
    return {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"},
                      {**redis_tier(redis, prefix), "write": "through"}]}


def left_within(left: float | None, most: float) -> bool:
    """A deadline read back ``most`` seconds off at most, and less than a minute gone."""
    return left is not None and most - 60 < left <= most


def test_a_deadline_one_client_sets_another_reads(
        tmp_path: Path, registry: BackendRegistry, redis: RedisServer) -> None:
    root = tmp_path / "node"
    due, later, plain = key(1), key(2), key(3)
    with PeerServer(root, config=node_config(redis, "pd")) as node, \
            chain_of(registry, peer_tier(node)) as a, chain_of(registry, peer_tier(node)) as b:
        blocks = [block(i, SIZE) for i in (1, 2, 3)]
        assert a.put([due, later, plain], blocks) == [True] * 3
        reader = b.tiers[0].handle
        assert reader.deadlines([due, later, plain, key(999)]) == [None] * 4
        assert a.expire([due], FAR) == [True]
        assert a.expire([later], 2 * FAR) == [True]
        first, second, none, absent = reader.deadlines([due, later, plain, key(999)])
        assert left_within(first, FAR) and left_within(second, 2 * FAR), (first, second)
        assert (none, absent) == (None, None)
        # the earliest among the server's tiers: set at the redis tier alone, from here
        with chain_of(registry, redis_tier(redis, "pd")) as direct:
            assert direct.expire([later], FAR / 2) == [True]
        (second,) = reader.deadlines([later])
        assert left_within(second, FAR / 2), second
        # another namespace's block under the same key has none
        with chain_of(registry, peer_tier(node), namespace=OTHER) as other:
            assert other.put([due], [block(9, SIZE)]) == [True]
            assert other.tiers[0].handle.deadlines([due]) == [None]
        # asking is no change: the blocks read back, byte for byte
        assert read(b, [due, later, plain], [SIZE] * 3) == blocks
        stats = dict(reader.stats())
        assert (stats["errors"], stats["reconnects"]) == (0, 0)
        (server,) = backend_of(b).server_stats().values()
        assert server is not None and server["server"]["by_kind"]["DEADLINES"] >= 4
        assert "protocol error" not in node.log()


def test_placement_all_answers_the_earliest_of_the_servers(
        tmp_path: Path, registry: BackendRegistry, redis: RedisServer) -> None:
    with PeerServer(tmp_path / "one", config=node_config(redis, "p1")) as one, \
            PeerServer(tmp_path / "two", config=node_config(redis, "p2")) as two, \
            chain_of(registry, peer_tier(one, two, placement="all")) as chain:
        assert chain.put([key(1)], [block(1, SIZE)]) == [True]
        for prefix, after in (("p1", 2 * FAR), ("p2", FAR)):  # each server's tier its own
            with chain_of(registry, redis_tier(redis, prefix)) as direct:
                assert direct.expire([key(1)], after) == [True]
        (left,) = chain.tiers[0].handle.deadlines([key(1)])
        assert left_within(left, FAR), left


def test_a_server_of_before_deadlines_gets_none_and_the_client_answers_none(
        tmp_path: Path, registry: BackendRegistry, redis: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer_server, "SERVE", OLD_SERVE)
    with PeerServer(tmp_path / "old", config=node_config(redis, "po")) as old, \
            chain_of(registry, peer_tier(old)) as chain:
        assert chain.put([key(1)], [block(1, SIZE)]) == [True]
        handle = chain.tiers[0].handle
        assert chain.expire([key(1)], FAR) == [True]  # the requests it knows still go
        assert handle.deadlines([key(1), key(2)]) == [None, None]
        assert read(chain, [key(1)], [SIZE]) == [block(1, SIZE)]
        stats = dict(handle.stats())
        assert (stats["errors"], stats["reconnects"], stats["peers_up"]) == (0, 0, 1)
        (server,) = backend_of(chain).server_stats().values()
        assert server is not None and "DEADLINES" not in server["server"]["by_kind"]
        assert server["server"]["by_kind"]["EXPIRE"] == 1
        assert "protocol error" not in old.log()
