"""Fixtures of the fs backend's tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

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
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                           capture_output=True, text=True, check=False)
    if mount.returncode:
        pytest.skip(f"mount refused: {mount.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
