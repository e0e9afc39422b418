"""The conformance kit on ``peer``, against a ``kvtier serve`` started here.

``peer`` runs through a chain (see ``kit_targets.PeerChainBackend`` for why it
cannot be certified bare), and bare for its ``framed_only`` declaration.
Every kit test opens a fresh namespace, so the tests of a class share one
server.  The other built-in backends' runs are in
``tests/backends/<name>/test_conformance.py``.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from peer_server import PeerServer, node_config

from kvtier.testing import BackendTests
from kvtier.testing.framed import FramedTests
from kvtier.testing.keep import KeepTests

#: Hypothesis budget of the stateful group here: every step is a network round
#: trip to a server sharing two cores with the test, so fewer examples than the
#: kit's default of 50 keep the run short while still mixing every operation.
REMOTE_STATEFUL_EXAMPLES = 15

PEER_SECRET = secrets.token_hex(16)


@pytest.fixture(scope="module")
def peer_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerServer]:
    """A ``kvtier serve`` whose chain is host RAM written through to a directory.

    The directory keeps every block, so a client's reopen finds them.  Each
    kit test has a namespace, hence a chain on the server, of its own; the RAM
    tier holds more than any test but crash safety writes to one, because a
    block the RAM tier evicts before its write-through has landed reads as a
    miss until it lands, and the kit would then be timing the server's disk.
    """
    root = tmp_path_factory.mktemp("kit-peer")
    with PeerServer(root, config=node_config(root, ram="64MiB"), secret=PEER_SECRET) as server:
        yield server


class TestPeerChain(BackendTests):
    """A chain of one ``peer`` tier (fast on loopback: the kit's full stateful budget)."""

    backend = "kit_targets:PeerChainBackend"

    @pytest.fixture
    def backend_options(self, peer_node: PeerServer) -> dict[str, Any]:
        return {"peer": peer_node.address, "secret": PEER_SECRET, "persistent": True}


class TestPeerDeclaration(FramedTests):
    """``peer`` itself, for what it declares: framed_only (the kit's other groups skip)."""

    backend = "peer"

    @pytest.fixture
    def backend_options(self, peer_node: PeerServer) -> dict[str, Any]:
        return {"peers": [peer_node.address], "secret": PEER_SECRET}


class TestPeerChainUnderRam(BackendTests):
    """Client RAM written through to the peer tier: reads served by either."""

    backend = "kit_targets:PeerChainBackend"
    stateful_max_examples = REMOTE_STATEFUL_EXAMPLES

    @pytest.fixture
    def backend_options(self, peer_node: PeerServer) -> dict[str, Any]:
        return {
            "peer": peer_node.address,
            "secret": PEER_SECRET,
            "ram": "256KiB",
            "persistent": True,
        }


@pytest.fixture(scope="module")
def keeping_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerServer]:
    """A ``kvtier serve`` whose RAM tier keeps marks: a ``keep`` budget for every tenant
    (the server counts each namespace as the tenant ``default``)."""
    root = tmp_path_factory.mktemp("kit-peer-keep")
    config = node_config(root, ram="64MiB")
    config["chain"][0]["tenants"] = {"*": {"keep": "8MiB"}}
    with PeerServer(root, config=config, secret=PEER_SECRET) as server:
        yield server


class TestPeerChainKeep(KeepTests):
    """The kit's ``keep`` group through a chain of one ``peer`` tier: KEEP and RELEASE
    reach the server's tiers (a peer tier declares no capacity: the kit's flood is
    ``tests/peer/test_peer_keep.py``'s)."""

    backend = "kit_targets:PeerChainBackend"

    @pytest.fixture
    def backend_options(self, keeping_node: PeerServer) -> dict[str, Any]:
        return {"peer": keeping_node.address, "secret": PEER_SECRET, "persistent": True}
