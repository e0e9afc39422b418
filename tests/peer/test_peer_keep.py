"""Keep through a ``peer`` tier: KEEP and RELEASE reach the tiers of a real ``kvtier serve``.

The server's RAM tier is small and keeps marks within its ``default`` rule's
``keep`` budget (the server counts every namespace as the tenant ``default``):
a client's kept blocks outlive a flood there, byte for byte, while the blocks
not kept go.  A server that predates the requests (its WELCOME lists none)
answers a clean refusal, and its connection stays up.  A connection's marks
reach its own namespace only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peer_server
import pytest
from peer_chain import NS, backend_of, block, chain_of, key, peer_tier, read
from peer_server import PeerServer

from kvtier import Namespace
from kvtier.plugins.registry import BackendRegistry

SIZE = 1024
#: The server's RAM: 64 blocks' worth, a budget of about 6 kept blocks (framed: a header each).
RAM = {"name": "ram", "backend": "host", "capacity": "68KiB",
       "tenants": {"*": {"keep": "7KiB"}}}
#: The server of before KEEP and RELEASE: none in its WELCOME, and a request of either type
#: is an unknown message, which closes the connection.
OLD_SERVE = [sys.executable, "-c",
             "import kvtier.peer.protocol as pp; pp.OPTIONAL = frozenset(); "
             "pp.REQUESTS = frozenset({pp.GET, pp.PUT, pp.LOOKUP, pp.EVICT, pp.STATS}); "
             "from kvtier.peer.server import serve_command; serve_command()"]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[PeerServer]:
    with PeerServer(tmp_path / "node", config={"chain": [RAM]}) as srv:
        yield srv


def server_ram(tier: Any, namespace: Namespace = NS) -> dict[str, Any]:
    """The figures of the server's RAM tier for ``namespace``, from its STATS reply."""
    (stats,) = backend_of(tier).server_stats().values()
    assert stats is not None
    return ram_of(stats, namespace)


def ram_of(stats: dict[str, Any], namespace: Namespace = NS) -> dict[str, Any]:
    (ram,) = [t for t in stats["namespaces"][namespace.hex]["tiers"] if t["name"] == "ram"]
    return {**ram["backend_stats"], "chain_keep_refused": ram["keep_refused"]}


def test_kept_blocks_outlive_a_flood_on_the_server(node: PeerServer,
                                                   registry: BackendRegistry) -> None:
    with chain_of(registry, peer_tier(node)) as chain:
        kept = [key(i) for i in range(4)]
        assert chain.put(kept, [block(i, SIZE) for i in range(4)]) == [True] * 4
        handle = chain.tiers[0].handle
        assert handle.keep([*kept, key(999)], True) == [True] * 4 + [None]
        assert chain.keep(kept) == [True] * 4
        for i in range(100, 300):  # three times the server's RAM
            assert chain.put([key(i)], [block(i, SIZE)]) == [True]
        assert read(chain, kept, [SIZE] * 4) == [block(i, SIZE) for i in range(4)]
        assert read(chain, [key(100)], [SIZE]) == [None]  # the flood's oldest went
        ram = server_ram(chain)
        assert ram["kept_blocks"] == 4 and ram["kept_bytes"] > 4 * SIZE
        # beyond the budget: refused per key, counted on the server
        more = [key(i) for i in range(290, 300)]
        answer = handle.keep(more, True)
        assert answer[:2] == [True, True] and answer[-1] is False, answer
        ram = server_ram(chain)
        assert ram["keep_refused"] == ram["chain_keep_refused"] == answer.count(False)
        assert handle.keep([*kept, key(999)], False) == [True] * 4 + [None]
        assert server_ram(chain)["kept_blocks"] == answer.count(True)


def test_marks_stay_in_the_connections_namespace(node: PeerServer,
                                                 registry: BackendRegistry) -> None:
    other_ns = Namespace("peer-test-other", dtype="bfloat16", tokens_per_block=16)
    with chain_of(registry, peer_tier(node)) as chain, \
            chain_of(registry, peer_tier(node), namespace=other_ns) as other:
        assert chain.put([key(1)], [block(1, SIZE)]) == [True]
        # the other namespace's connection names the same key: not held there
        assert other.tiers[0].handle.keep([key(1)], True) == [None]
        assert server_ram(chain)["kept_blocks"] == 0
        assert chain.tiers[0].handle.keep([key(1)], True) == [True]
        # nor can it release the mark (kept_blocks counts the server's one RAM store)
        assert other.tiers[0].handle.keep([key(1)], False) == [None]
        assert server_ram(other, other_ns)["kept_blocks"] == 1
        assert read(other, [key(1)], [SIZE]) == [None]


def test_placement_all_keeps_on_every_server(tmp_path: Path, registry: BackendRegistry) -> None:
    with PeerServer(tmp_path / "a", config={"chain": [RAM]}) as a, \
            PeerServer(tmp_path / "b", config={"chain": [RAM]}) as b, \
            chain_of(registry, peer_tier(a, b, placement="all")) as chain:
        assert chain.put([key(1)], [block(1, SIZE)]) == [True]
        assert chain.keep([key(1)]) == [True]
        stats = backend_of(chain).server_stats()
        assert [ram_of(s)["kept_blocks"] for s in stats.values() if s is not None] == [1, 1]


def test_a_server_of_before_keep_refuses_cleanly(tmp_path: Path, registry: BackendRegistry,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer_server, "SERVE", OLD_SERVE)
    with PeerServer(tmp_path / "old", config={"chain": [RAM]}) as old, \
            chain_of(registry, peer_tier(old)) as chain:
        assert chain.put([key(1)], [block(1, SIZE)]) == [True]
        handle = chain.tiers[0].handle
        assert handle.keep([key(1), key(2)], True) == [False, False]
        assert handle.keep([key(1), key(2)], False) == [None, None]
        assert chain.keep([key(1)]) == [False]  # refused, not an error
        assert read(chain, [key(1)], [SIZE]) == [block(1, SIZE)]
        stats = dict(handle.stats())
        assert (stats["errors"], stats["reconnects"], stats["peers_up"]) == (0, 0, 1)
        assert "protocol error" not in old.log()
