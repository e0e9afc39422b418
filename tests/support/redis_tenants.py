"""What the kvtier-redis tenant, keep and deadline tests share: a fresh database, the
blocks they store, and a backend opened as a chain opens it for one tenant's namespace.

The module-scoped ``redis_server`` fixture is in ``tests/contrib/conftest.py``.
"""

from __future__ import annotations

import random
from typing import Any

import redis
from kvtier_redis import RedisBackend
from redis_server import RedisServer


def fresh_url(server: RedisServer, db: int) -> str:
    """The URL of database ``db`` on ``server``, emptied first."""
    with redis.Redis.from_url(server.url(db)) as client:
        client.flushdb()
    return server.url(db)


def block(seed: int, size: int = 1000) -> bytes:
    return random.Random(seed).randbytes(size)


def open_tenant(url: str, tenant: str, namespace: str, **options: Any) -> RedisBackend:
    backend = RedisBackend()
    backend.kvtier_open({"url": url, "tenant": tenant, **options}, namespace)
    return backend
