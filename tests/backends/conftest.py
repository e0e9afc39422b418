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

from kvtier.plugins.registry import BackendHandle, default_registry

# --- the host backend's modules (test_host_*.py) -------------------------------------


@pytest.fixture(params=POLICIES)
def host(request: pytest.FixtureRequest) -> Iterator[BackendHandle]:
    """An open ``host`` backend of 64 MiB, once per eviction policy."""
    handle = open_host(64 * MiB, request.param)
    yield handle
    handle.close()


# --- the fs backend's modules (test_fs_*.py) -----------------------------------------


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
