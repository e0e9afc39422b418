"""The ``open_object`` fixture the ``object`` tier's tenant, keep and deadline tests share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from object_blocks import Opener
from seaweed import SeaweedServer, object_options

from kvtier.plugins.registry import BackendHandle, default_registry


@pytest.fixture
def open_object(s3_server: SeaweedServer, bucket: str) -> Iterator[Opener]:
    """Opens object instances, ``opener(namespace, **options)``, under one prefix of this
    test's, with no lookup cache (every lookup asks the bucket); closes them after it."""
    handles: list[BackendHandle] = []
    prefix = object_options(s3_server, bucket)["prefix"]

    def opener(namespace: str, **over: Any) -> BackendHandle:
        handle = default_registry().create("object")
        handle.open(object_options(s3_server, bucket, prefix=prefix, lookup_cache_ttl=0,
                                   **over), namespace)
        handles.append(handle)
        return handle

    yield opener
    for handle in handles:
        handle.close()
