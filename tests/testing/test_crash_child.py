"""The every-step crash test numbers I/O calls, not the methods of values named like them.

A put through an HTTP client (fs on S3 through s3fs and botocore) calls
``str.replace`` dozens of times per request: numbered as I/O calls, they made
107 kill points of a put whose real steps are about ten, and the kit sampled
42 of them, so a real step could go unkilled.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from kvtier.testing.crash_child import _Cutter


def _generator() -> Iterator[int]:
    while True:
        yield 1


def _numbered(work: Callable[[], None]) -> int:
    """How many calls of ``work()`` the crash writer would number (it never kills here)."""
    cutter = _Cutter(kill_at=None)
    cutter.armed = True
    sys.setprofile(cutter)
    try:
        work()
    finally:
        sys.setprofile(None)
    return cutter.count


def test_io_calls_are_numbered(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"

    def write_then_publish() -> None:
        out = open(first, "wb")  # noqa: SIM115 (each call is one step here)
        out.write(b"block")
        out.close()
        os.replace(first, second)

    assert _numbered(write_then_publish) == 4  # open, write, close, replace
    assert second.read_bytes() == b"block"


def test_string_methods_named_like_io_calls_are_not() -> None:
    def no_io() -> None:
        "a-b".replace("-", "+")
        b"a-b".replace(b"-", b"+")
        bytearray(b"a-b").replace(b"-", b"+")
        bytearray(b"ab").remove(ord("a"))

    assert _numbered(no_io) == 0


def test_container_and_generator_methods_named_like_io_calls_are_not() -> None:
    """A store whose I/O is all native (obstore) showed two "kill points", both
    a ``deque.remove`` of :mod:`threading`'s waiters: no step of its put."""

    def no_io() -> None:
        [1, 2].remove(1)
        {1, 2}.remove(1)
        deque([1, 2]).remove(1)
        gen = _generator()
        next(gen)
        gen.send(None)
        gen.close()

    assert _numbered(no_io) == 0


def test_both_together_count_only_the_io(tmp_path: Path) -> None:
    target = tmp_path / "block"

    def mixed() -> None:
        name = str(target).replace("block", "block.tmp")
        out = open(name, "wb")  # noqa: SIM115
        out.write(b"x")
        out.close()
        pending = [name]
        pending.remove(name)
        os.replace(name, target)

    assert _numbered(mixed) == 4
    assert target.read_bytes() == b"x"
