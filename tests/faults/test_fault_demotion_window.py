"""A block being demoted by capacity must stay readable while it moves down.

Found by the soak: a reader sometimes missed a block that was stored and
never evicted, although the block was found again a moment later.  The fs
backend takes a capacity victim out of its index and off the disk inside a
put; the chain now takes the victim as "being demoted" the moment the
backend reports it, not when the put returns.  The backend below is the
real fs backend, stopped right after its put.
"""

from __future__ import annotations

import threading
from collections.abc import MutableSequence, Sequence
from pathlib import Path
from typing import Any

from faultkit import block_for, read_exact

import kvtier
from kvtier.backends.fs import FsBackend
from kvtier.plugins.registry import BackendRegistry

NS = kvtier.Namespace("window-model")
SIZE = 64 * 1024


class GatedFs(FsBackend):
    """The fs backend; when armed, a put waits after it has done its work."""

    inside = threading.Event()
    release = threading.Event()
    armed = False

    def _write_blocks(self, keys: Sequence[bytes], parts: Sequence[Sequence[Any]],
                      sizes: list[int], evicted: MutableSequence[tuple[bytes, Any]]) -> list[bool]:
        result: list[bool] = super()._write_blocks(keys, parts, sizes, evicted)
        if GatedFs.armed:
            GatedFs.armed = False
            GatedFs.inside.set()
            GatedFs.release.wait(60)
        return result


def test_a_capacity_victim_stays_readable_during_the_put(tmp_path: Path) -> None:
    registry = BackendRegistry()
    registry.register("gatedfs", GatedFs)
    config = {"chain": [
        {"name": "disk", "backend": "gatedfs", "url": f"file://{tmp_path}/disk",
         "capacity": 3 * SIZE + 4096},
        {"name": "deep", "backend": "fs", "url": f"file://{tmp_path}/deep", "write": "back"},
    ]}
    keys = [f"window/{i}".encode() for i in range(4)]
    with kvtier.open_chain(config, namespace=NS, registry=registry) as chain:
        assert chain.put(keys[:3], [block_for(k, SIZE) for k in keys[:3]]) == [True] * 3
        GatedFs.inside.clear()
        GatedFs.release.clear()
        GatedFs.armed = True
        writer = threading.Thread(target=chain.put, args=([keys[3]], [block_for(keys[3], SIZE)]))
        writer.start()
        try:
            assert GatedFs.inside.wait(60)
            during = read_exact(chain, keys[:1], [SIZE])
        finally:
            GatedFs.release.set()
            writer.join(60)
        assert chain.flush(60)
        # not lost: it arrives below once the put has returned
        assert read_exact(chain, keys[:1], [SIZE]) == [block_for(keys[0], SIZE)]
        assert during == [block_for(keys[0], SIZE)]
