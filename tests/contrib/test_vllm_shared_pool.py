"""Two vLLM engines as two nodes sharing one pool (``shared_pool.py``), and pool capacity.

Node A computes a prompt and writes its blocks through to the shared tier;
node B, a fresh engine process whose own fs tier is empty, serves the prompt
from the shared tier with identical greedy output.  The shared tier here is
the ``object`` tier on the replicated SeaweedFS cluster, and then kvtier-redis
with ``cluster: true`` on a 3-master + 3-replica Redis Cluster; the harness
takes any tier entry.

Then capacity with several writers: two chains write one capacity-bounded
namespace of the bucket, and what the bucket really holds (listed with
obstore) stays within the capacity and agrees with both writers' stats.
"""

from __future__ import annotations

import importlib.util
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from redis_cluster import RedisClusterServer
from seaweed_cluster import SeaweedCluster
from shared_pool import run_two_nodes

log = logging.getLogger("kvtier.tests")

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)

# 4 full blocks of 32 tokens and 4 more: 128 tokens can come from a tier
PROMPTS = {"shared": [(i * 41 + 13) % 500 + 3 for i in range(132)]}
BLOCKS, CACHED = 4, 128


def object_tier(cluster: SeaweedCluster, bucket: str, **over: Any) -> dict[str, Any]:
    """The ``object`` tier entry of a node, on ``bucket`` of ``cluster``."""
    return {
        "name": "pool", "backend": "object", "bucket": bucket,
        "endpoint": cluster.endpoint, "region": cluster.region,
        "access_key_id": cluster.access_key, "secret_access_key": cluster.secret_key,
        "allow_http": True, "connect_timeout": "2s", "request_timeout": "10s", **over,
    }


def check_two_nodes_share(base: Path, model: str, shared: dict[str, Any]) -> None:
    """The shared-pool claim for any shared tier entry ``shared``."""
    name = shared["name"]
    a, b = run_two_nodes(base, model, PROMPTS, shared)
    log.info("shared pool %s: node A %.1fs (engine %.1fs), node B %.1fs (engine %.1fs); "
             "A tiers %s; B tiers %s", name, a.seconds, a.result["engine_s"], b.seconds,
             b.result["engine_s"], a.tiers(), b.tiers())
    assert a.namespace() == b.namespace()
    # node A computed everything and wrote it through to the pool
    assert a.cached() == {"shared": 0}
    assert a.tiers()[name]["puts"] == BLOCKS
    assert a.tiers()["disk"]["puts"] == BLOCKS
    # node B: nothing in its own fs tier, every full block a hit from the pool
    assert b.cached() == {"shared": CACHED}
    assert b.outputs() == a.outputs()
    assert b.tiers()["disk"]["hits"] == 0
    assert b.tiers()[name]["hits"] == BLOCKS
    assert b.tiers()[name]["corrupt"] == 0
    assert b.tiers()[name]["puts"] == 0  # already there: nothing written again


@needs_vllm
@pytest.mark.timeout(900)
def test_two_engines_share_the_object_tier_on_the_cluster(
    seaweed_cluster: SeaweedCluster, model_dir: str, tmp_path: Path
) -> None:
    bucket = seaweed_cluster.make_bucket(f"kvt-pool-{uuid.uuid4().hex[:10]}")
    check_two_nodes_share(tmp_path, model_dir, object_tier(seaweed_cluster, bucket))


@needs_vllm
@pytest.mark.timeout(900)
def test_two_engines_share_a_redis_cluster_tier(
    redis_cluster: RedisClusterServer, model_dir: str, tmp_path: Path
) -> None:
    pytest.importorskip("kvtier_redis", reason="kvtier-redis is not installed")
    prefix = f"pool-{uuid.uuid4().hex[:8]}"
    check_two_nodes_share(tmp_path, model_dir, redis_cluster.tier(
        "pool", prefix=prefix, shards=4, capacity="64MiB", max_block_size="8MiB"))


# --- capacity with several writers -------------------------------------------------------

POOL_CAPACITY = 1 << 20
POOL_BLOCK = 32 * 1024
ROUNDS, PER_ROUND = 6, 8  # each writer: 6 x 8 x 32 KiB = 1.5 MiB, both together 3 MiB


def listed(cluster: SeaweedCluster, bucket: str, prefix: str) -> dict[str, int]:
    """Object name -> size under ``prefix`` of ``bucket``, as the bucket itself lists it."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(bucket, config={
        "endpoint": cluster.endpoint, "region": cluster.region,
        "access_key_id": cluster.access_key, "secret_access_key": cluster.secret_key,
    }, client_options={"allow_http": True})
    return {meta["path"]: meta["size"]
            for chunk in obstore.list(store, prefix + "/") for meta in chunk}


def backend_stats(chain: Any) -> dict[str, Any]:
    stats: dict[str, Any] = chain.stats()["tiers"][0]["backend_stats"]
    return stats


def settle(chain: Any, key: bytes) -> None:
    """Until a LIST pass of this writer has begun and ended after this call.

    A put triggers a pass (``scan_interval: 0``) unless one is running, which
    may have listed before the other writer's last blocks: two passes more
    than now means one began after the call.
    """
    import time

    target = backend_stats(chain)["scans"] + 2
    deadline = time.monotonic() + 60
    while backend_stats(chain)["scans"] < target:
        assert time.monotonic() < deadline, "no LIST pass within 60 s"
        chain.put([key], [b"\0" * 16])  # already stored: triggers a pass, uploads nothing
        time.sleep(0.05)


def test_pool_capacity_holds_with_two_writers(seaweed_cluster: SeaweedCluster) -> None:
    import random

    from kvtier import Namespace, open_chain

    bucket = seaweed_cluster.make_bucket(f"kvt-cap-{uuid.uuid4().hex[:10]}")
    prefix = f"pool/{uuid.uuid4().hex[:8]}"
    tier = object_tier(seaweed_cluster, bucket, prefix=prefix, capacity=POOL_CAPACITY,
                       scan_interval="0s")
    namespace = Namespace("pool-capacity", dtype="bfloat16", tokens_per_block=32)
    chains = [open_chain({"chain": [tier]}, namespace=namespace) for _ in range(2)]
    root = f"{prefix}/{namespace.hex}"
    marker = b"settle-marker"
    try:
        chains[0].put([marker], [b"\0" * 16])
        peaks: list[int] = []
        written: dict[bytes, bytes] = {}
        for r in range(ROUNDS):
            for w, chain in enumerate(chains):
                keys = [b"w%d-r%d-b%d" % (w, r, i) for i in range(PER_ROUND)]
                blocks = [random.Random(k).randbytes(POOL_BLOCK) for k in keys]
                assert chain.put(keys, blocks) == [True] * PER_ROUND
                written.update(zip(keys, blocks))
                peaks.append(sum(listed(seaweed_cluster, bucket, root).values()))
            for chain in (*chains, chains[0]):  # the last pass sees the other's deletions
                settle(chain, marker)
            held = listed(seaweed_cluster, bucket, root)
            total = sum(held.values())
            assert total <= POOL_CAPACITY, (r, total)
            for chain in chains:
                stats = backend_stats(chain)
                assert (stats["used_bytes"], stats["blocks"]) == (total, len(held)), (r, stats)
        log.info("pool capacity %d bytes, two writers: settled totals within it; largest "
                 "total listed between passes %d bytes (%.2fx capacity)", POOL_CAPACITY,
                 max(peaks), max(peaks) / POOL_CAPACITY)
        # what is listed reads back intact through either writer, and nothing else does
        keys = sorted(written)
        for chain in chains:
            found = chain.get_bytes(keys)
            assert all(f is None or f == written[k] for k, f in zip(keys, found))
            hits = sum(f is not None for f in found)
            assert hits in (len(held), len(held) - 1), (hits, len(held))  # - the marker
            assert hits > 0
    finally:
        for chain in chains:
            chain.close()
