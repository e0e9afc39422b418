"""Filesystems mounted for one test: one that fills (tmpfs), one slower (ext4 from a file)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted(disk: Path, *mount_args: str) -> Iterator[Path]:
    """``mount *mount_args disk`` for the block, lazily unmounted after it; the test is skipped
    where the machine refuses the mount (no privilege in a container)."""
    mount = subprocess.run(["mount", *mount_args, str(disk)],
                           capture_output=True, text=True, check=False)
    if mount.returncode:
        pytest.skip(f"mount refused: {mount.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
