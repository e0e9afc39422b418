"""The ``object`` backend on a replicated, multi-node SeaweedFS (``seaweed_cluster.py``).

The conformance kit certifies ``object`` on the cluster unchanged: the
backend needs no code of its own for it.  Then one volume server is killed
(SIGKILL) while threads write and read through a chain: with replication
``001`` every acknowledged block has a second copy, so no read of one is
lost and no byte is wrong.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from seaweed import object_options
from seaweed_cluster import SeaweedCluster

from kvtier import Chain, Namespace, open_chain
from kvtier.testing import BackendTests

log = logging.getLogger("kvtier.tests")

#: As on the single server (tests/test_kit_remote.py): every stateful step is
#: a round trip through the gateway, filer and two volume servers.
CLUSTER_STATEFUL_EXAMPLES = 10


@pytest.fixture(scope="module")
def cluster_bucket(seaweed_cluster: SeaweedCluster) -> str:
    """One bucket for the kit tests of this module (each test has its own namespace)."""
    return seaweed_cluster.make_bucket(f"kvt-cl-{uuid.uuid4().hex[:12]}")


class TestObjectOnCluster(BackendTests):
    backend = "object"
    stateful_max_examples = CLUSTER_STATEFUL_EXAMPLES
    extra_options: dict[str, Any] = {}  # what a subclass adds to the tier's options

    @pytest.fixture
    def backend_options(
        self, seaweed_cluster: SeaweedCluster, cluster_bucket: str
    ) -> dict[str, Any]:
        return object_options(seaweed_cluster, cluster_bucket, **self.extra_options)


class TestObjectWithCapacityOnCluster(TestObjectOnCluster):
    extra_options = {"capacity": "1MiB"}

    def test_capacity_holds_for_all_instances_together(self) -> None:
        pytest.skip(
            "object bounds each writer's view of the namespace, which learns of the others' "
            "blocks at its next LIST: N writers hold up to N x capacity (docs/shared-capacity.md)"
        )


def test_every_volume_has_two_copies(seaweed_cluster: SeaweedCluster, cluster_bucket: str) -> None:
    chain = open_chain({"chain": [{"name": "s3", "backend": "object",
                                   **object_options(seaweed_cluster, cluster_bucket)}]},
                       namespace=NS)
    with chain:
        assert all(chain.put([block_key(i)], [payload(i)]) == [True] for i in range(20))
    replicas = seaweed_cluster.replicas(cluster_bucket)
    assert replicas, "the bucket has no volumes"
    assert {len(servers) for servers in replicas.values()} == {2}, replicas


# --- a volume server dies under load -----------------------------------------------------

NS = Namespace("cluster-kill", dtype="bfloat16", tokens_per_block=32)
THREADS = 4
BLOCK = 64 * 1024
RUN_BEFORE_KILL = 3.0  # seconds of load on the healthy cluster
RUN_AFTER_KILL = 8.0  # long enough for the master to drop the dead server (heartbeats)


def block_key(i: int) -> bytes:
    return b"kill-%08d" % i


def payload(i: int) -> bytes:
    return random.Random(i).randbytes(BLOCK)


@pytest.fixture
def doomed_cluster(tmp_path: Path) -> Iterator[SeaweedCluster]:
    """A cluster of this test's own: it loses a volume server."""
    cluster = SeaweedCluster(tmp_path / "cluster")
    with cluster:
        yield cluster


class Load:
    """Threads that put new blocks and read back acknowledged ones, counting outcomes."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.lock = threading.Lock()
        self.acked: list[int] = []
        self.next_id = 0
        self.counts = {"puts": 0, "acked": 0, "refused": 0, "reads": 0, "lost": 0,
                       "wrong": 0, "exceptions": 0}
        self.stop = threading.Event()

    def _add(self, **amounts: int) -> None:
        with self.lock:
            for name, n in amounts.items():
                self.counts[name] += n

    def work(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            try:
                with self.lock:
                    i, self.next_id = self.next_id, self.next_id + 1
                    known = rng.sample(self.acked, min(4, len(self.acked)))
                stored = self.chain.put([block_key(i)], [payload(i)])
                self._add(puts=1, **({"acked": 1} if stored[0] else {"refused": 1}))
                if stored[0]:
                    with self.lock:
                        self.acked.append(i)
                found = self.chain.get_bytes([block_key(j) for j in known])
                self._add(reads=len(known), lost=sum(f is None for f in found),
                          wrong=sum(f is not None and f != payload(j)
                                    for f, j in zip(found, known)))
            except Exception:
                log.exception("chain call failed")
                self._add(exceptions=1)


def test_volume_server_killed_mid_run(doomed_cluster: SeaweedCluster) -> None:
    bucket = doomed_cluster.make_bucket(f"kvt-kill-{uuid.uuid4().hex[:8]}")
    tier = {"name": "s3", "backend": "object",
            **object_options(doomed_cluster, bucket, request_timeout="10s")}
    with open_chain({"chain": [tier]}, namespace=NS) as chain:
        load = Load(chain)
        threads = [threading.Thread(target=load.work, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        time.sleep(RUN_BEFORE_KILL)
        before = dict(load.counts)
        victim = doomed_cluster.volumes[1]
        held = [v for v, servers in doomed_cluster.replicas(bucket).items()
                if doomed_cluster.address(victim) in servers]
        assert held, "the server to kill holds none of the bucket's volumes"
        victim.kill()
        killed_at = time.monotonic()
        time.sleep(RUN_AFTER_KILL)
        load.stop.set()
        for t in threads:
            t.join(60)
        after_kill = time.monotonic() - killed_at
        stats = chain.stats()
    log.info("volume server holding %d of the bucket's volumes killed: before %s, "
             "at end %s (%.1fs after), chain stats %s",
             len(held), before, load.counts, after_kill, stats)
    counts = load.counts
    assert before["acked"] > 0 and counts["acked"] > before["acked"], counts
    assert counts["exceptions"] == 0, counts
    assert counts["wrong"] == 0, counts
    assert counts["lost"] == 0, counts
    # and afterwards, from a fresh chain (nothing cached): every acknowledged block, intact
    with open_chain({"chain": [tier]}, namespace=NS) as fresh:
        ids = sorted(load.acked)
        found = fresh.get_bytes([block_key(i) for i in ids])
    missing = [i for i, f in zip(ids, found) if f is None]
    wrong = [i for i, f in zip(ids, found) if f is not None and f != payload(i)]
    log.info("after the kill: %d acknowledged blocks re-read, %d missing, %d wrong",
             len(ids), len(missing), len(wrong))
    assert (missing, wrong) == ([], [])
