"""Fixtures of the fs backend's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from mounts import mounted

from kvtier.plugins.registry import BackendHandle


@pytest.fixture
def handles() -> Iterator[list[BackendHandle]]:
    """The handles a test opens (:func:`fs_blocks.open_fs` adds them), closed after it."""
    opened: list[BackendHandle] = []
    yield opened
    for handle in opened:
        handle.close()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs mounted for the test: a filesystem that fills, with its own free space."""
    disk = tmp_path / "disk"
    disk.mkdir()
    with mounted(disk, "-t", "tmpfs", "-o", "size=16m", "tmpfs"):
        yield disk
