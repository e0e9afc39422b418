"""The conformance kit on the built-in backends that need a server: object, fs on s3://, peer.

``object`` and ``fs`` (through s3fs) run against the session's SeaweedFS
(``s3_server`` in ``conftest.py``); ``peer`` runs against a ``kvtier serve``
started here, through a chain (see ``kit_targets.PeerChainBackend`` for why
it cannot be certified bare), and bare for its ``framed_only`` declaration.
The crash-safety child gets the same options as JSON, so it reaches the same
servers.

Every kit test opens a fresh namespace, so the tests of a class share one
bucket (or one server) instead of making a bucket per test: SeaweedFS gives
every bucket volumes of its own, and a few hundred would fill a small disk.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from peer_server import PeerServer, node_config
from seaweed import SeaweedServer

from kvtier.testing import BackendTests
from kvtier.testing.framed import FramedTests

#: Hypothesis budget of the stateful group here: every step is a network round
#: trip to a server sharing two cores with the test, so fewer examples than the
#: kit's default of 50 keep the run short while still mixing every operation.
REMOTE_STATEFUL_EXAMPLES = 15


@pytest.fixture(scope="module")
def kit_bucket(s3_server: SeaweedServer) -> str:
    """One bucket for every kit test of this module (each test has its own namespace)."""
    return s3_server.make_bucket(f"kvt-kit-{uuid.uuid4().hex[:12]}")


def object_options(server: SeaweedServer, bucket: str, **over: Any) -> dict[str, Any]:
    return {
        "bucket": bucket,
        "endpoint": server.endpoint,
        "region": server.region,
        "access_key_id": server.access_key,
        "secret_access_key": server.secret_key,
        "allow_http": True,
        # a prefix per test as well: a leftover of one test can never answer in another
        "prefix": f"kit/{uuid.uuid4().hex[:8]}",
        **over,
    }


class TestObjectOnSeaweed(BackendTests):
    backend = "object"
    stateful_max_examples = REMOTE_STATEFUL_EXAMPLES

    @pytest.fixture
    def backend_options(self, s3_server: SeaweedServer, kit_bucket: str) -> dict[str, Any]:
        return object_options(s3_server, kit_bucket)


class TestObjectWithCapacity(BackendTests):
    """With ``capacity`` the backend keeps an index and deletes the oldest blocks."""

    backend = "object"
    stateful_max_examples = REMOTE_STATEFUL_EXAMPLES

    @pytest.fixture
    def backend_options(self, s3_server: SeaweedServer, kit_bucket: str) -> dict[str, Any]:
        # small: the capacity group puts three times the capacity, block by block
        return object_options(s3_server, kit_bucket, capacity="1MiB")


class TestFsOnSeaweed(BackendTests):
    backend = "fs"
    # fs asks the store about every key its index lacks (another process may
    # have stored it), so lookups and misses cost round trips: the slowest
    # backend here gets the smallest budgets
    stateful_max_examples = 6
    concurrency_steps = 60

    @pytest.fixture
    def backend_options(self, s3_server: SeaweedServer, kit_bucket: str) -> dict[str, Any]:
        return {
            "url": f"s3://{kit_bucket}/fs/{uuid.uuid4().hex[:8]}",
            "capacity": "2MiB",
            "storage_options": {
                "key": s3_server.access_key,
                "secret": s3_server.secret_key,
                "endpoint_url": s3_server.endpoint,
                "client_kwargs": {"region_name": s3_server.region},
                # every open is a new client: a cached one would carry its listings
                "skip_instance_cache": True,
            },
        }


# --- peer, through a chain -----------------------------------------------------------

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
