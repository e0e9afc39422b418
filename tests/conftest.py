"""Fixtures shared by the test modules."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
from redis_cluster import RedisClusterServer
from seaweed import SeaweedServer
from seaweed_cluster import SeaweedCluster


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """A SeaweedFS S3 server for the whole run; its log is ``weed.log`` beside its data."""
    with SeaweedServer(tmp_path_factory.mktemp("seaweedfs")) as server:
        logging.getLogger("kvtier.tests").info(
            "SeaweedFS S3 at %s, data %s, log %s", server.endpoint, server.data_dir, server.log_path
        )
        yield server


@pytest.fixture
def bucket(s3_server: SeaweedServer) -> str:
    """A new, empty bucket on ``s3_server``; its name."""
    return s3_server.make_bucket(f"kvt-{uuid.uuid4().hex[:16]}")


@pytest.fixture(scope="session")
def seaweed_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedCluster]:
    """A replicated SeaweedFS (master, three volume servers, filer, S3; replication 001)."""
    with SeaweedCluster(tmp_path_factory.mktemp("seaweed-cluster")) as cluster:
        logging.getLogger("kvtier.tests").info(
            "SeaweedFS cluster S3 at %s, logs in %s", cluster.endpoint, cluster.base_dir
        )
        yield cluster


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    """A 3-master + 3-replica Redis Cluster (Debian's redis-server) for one test module."""
    with RedisClusterServer(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster
