"""Fixtures shared by the backend test modules."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fs_blocks import NS, Opener, options
from host_blocks import POLICIES, MiB, open_host
from seaweed import SeaweedServer

from kvtier.plugins.registry import BackendHandle, default_registry

# --- the host backend's tests (host/) ---------------------------------------------


@pytest.fixture(params=POLICIES)
def host(request: pytest.FixtureRequest) -> Iterator[BackendHandle]:
    """An open ``host`` backend of 64 MiB, once per eviction policy."""
    handle = open_host(64 * MiB, request.param)
    yield handle
    handle.close()


# --- the fs backend's tests (fs/) -------------------------------------------------


@pytest.fixture(params=["file", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An ``fs`` store URL, once a local directory and once ``memory://`` (removed after)."""
    if request.param == "file":
        yield f"file://{tmp_path}/store"
        return
    root = f"/kvtier-test-{uuid.uuid4().hex}"
    yield f"memory://{root}"
    mem = fsspec.filesystem("memory")
    if mem.exists(root):
        mem.rm(root, recursive=True)


@pytest.fixture
def local_url(tmp_path: Path) -> str:
    """An ``fs`` store URL on a local directory."""
    return f"file://{tmp_path}/store"


@pytest.fixture
def opener() -> Iterator[Opener]:
    """Opens ``fs`` backends (every option passed, see ``fs_blocks.options``); closes them after."""
    handles: list[BackendHandle] = []

    def open_(url: str, namespace: str = NS, **over: Any) -> BackendHandle:
        handle = default_registry().create("fs")
        handle.open(options(url, **over), namespace)
        handles.append(handle)
        return handle

    yield open_
    for handle in handles:
        handle.close()


# --- the kit on SeaweedFS (fs/ and object/test_conformance.py) ---------------------


@pytest.fixture(scope="module")
def kit_bucket(s3_server: SeaweedServer) -> str:
    """One bucket for every kit test of a module (each test has its own namespace).

    SeaweedFS gives every bucket volumes of its own: a bucket per kit test, a
    few hundred of them, would fill a small disk.
    """
    return s3_server.make_bucket(f"kvt-kit-{uuid.uuid4().hex[:12]}")
