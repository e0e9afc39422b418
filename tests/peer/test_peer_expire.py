"""Deadlines through a ``peer`` tier: EXPIRE reaches the tiers of a real ``kvtier serve``.

The server's chain is RAM written through to an ``fs`` pool (a local root with
a capacity, whose index every process on the root reads): a block given a
deadline through the peer is a miss after it, read through the peer and read
directly at the server's disk from this process, while a block given none
reads back byte for byte at both.  A server of before EXPIRE (its WELCOME
lists KEEP and RELEASE only) gets no EXPIRE: the client answers False, and its
connection stays up.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import peer_server
import pytest
from peer_chain import NS, backend_of, block, chain_of, key, peer_tier, read
from peer_server import PeerServer

from kvtier.plugins.registry import BackendRegistry

SIZE = 4096
#: The deadline given, in seconds: long enough for a read before it.
AFTER = 0.6
#: The server of before EXPIRE: KEEP and RELEASE in its WELCOME, not EXPIRE, and a
#: request of that type is an unknown message, which would close the connection.
OLD_SERVE = [sys.executable, "-c",
             "import kvtier.peer.protocol as pp; pp.OPTIONAL = frozenset({pp.KEEP, pp.RELEASE}); "
             "pp.REQUESTS = frozenset({pp.GET, pp.PUT, pp.LOOKUP, pp.EVICT, pp.STATS}) "
             "| pp.OPTIONAL; from kvtier.peer.server import serve_command; serve_command()"]


#: Each tier keeps marks, for the server's tenant ``default`` (every namespace is it there).
BUDGET = {"tenants": {"*": {"keep": "64KiB"}}}


def disk_tier(root: Path) -> dict[str, Any]:
    """The server's disk: an ``fs`` pool, so another process on the root sees its deadlines
    (each process on a root names the same tenants)."""
    return {"name": "disk", "backend": "fs", "url": f"file://{root}/disk", "capacity": "4MiB",
            **BUDGET}


def node_config(root: Path) -> dict[str, Any]:
    return {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB", **BUDGET},
                      {**disk_tier(root), "write": "through"}]}


def server_tier(stats: dict[str, Any], name: str) -> dict[str, Any]:
    (tier,) = [t for t in stats["namespaces"][NS.hex]["tiers"] if t["name"] == name]
    return tier


def test_a_deadline_given_through_the_peer_expires_the_block_at_the_server(
        tmp_path: Path, registry: BackendRegistry) -> None:
    root = tmp_path / "node"
    due, kept = key(1), key(2)
    with PeerServer(root, config=node_config(root)) as node, \
            chain_of(registry, peer_tier(node)) as chain:
        assert chain.put([due, kept], [block(1, SIZE), block(2, SIZE)]) == [True, True]
        handle = chain.tiers[0].handle
        assert handle.expire([key(999)], AFTER) == [None]  # held by no tier there
        asked = time.monotonic()
        assert chain.expire([due], AFTER) == [True]
        start = time.monotonic()  # the deadline is no later than start + AFTER
        if start - asked < AFTER / 2:  # a slow call leaves no time to read
            assert read(chain, [due], [SIZE]) == [block(1, SIZE)]
        time.sleep(max(0.0, start + AFTER - time.monotonic()) + 0.1)
        assert read(chain, [due, kept], [SIZE] * 2) == [None, block(2, SIZE)]
        assert chain.lookup([due])[0] is None
        (server,) = backend_of(chain).server_stats().values()
        assert server is not None
        assert server_tier(server, "ram")["backend_stats"]["expired"] == 1
        # the server's disk, read here: the deadline reached it too
        with chain_of(registry, disk_tier(root)) as disk:
            assert read(disk, [due, kept], [SIZE] * 2) == [None, block(2, SIZE)]
        assert "protocol error" not in node.log()


def test_a_server_of_before_expire_gets_none_and_the_client_answers_false(
        tmp_path: Path, registry: BackendRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer_server, "SERVE", OLD_SERVE)
    root = tmp_path / "old"
    with PeerServer(root, config=node_config(root)) as old, \
            chain_of(registry, peer_tier(old)) as chain:
        assert chain.put([key(1)], [block(1, SIZE)]) == [True]
        handle = chain.tiers[0].handle
        assert handle.expire([key(1), key(2)], AFTER) == [False, False]
        assert chain.expire([key(1)], AFTER) == [False]  # may outlive it: not an error
        assert handle.keep([key(1)], True) == [True]  # the requests it knows still go
        time.sleep(AFTER + 0.2)
        assert read(chain, [key(1)], [SIZE]) == [block(1, SIZE)]
        stats = dict(handle.stats())
        assert (stats["errors"], stats["reconnects"], stats["peers_up"]) == (0, 0, 1)
        assert "protocol error" not in old.log()
