"""Options, blocks and on-disk paths for the ``fs`` backend's test modules.

``tests/backends/fs/test_{data_path,capacity,persistence,faults}.py`` drive the
``fs`` backend through the registry, on a local directory and on ``memory://``;
their fixtures (``url``, ``local_url``, ``opener``) are in ``tests/backends/conftest.py``.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtier.backends.fs.local import LocalStore
from kvtier.backends.fs.pool import DB_NAME
from kvtier.plugins.registry import BackendHandle, default_registry
from kvtier.spec import BytesLike

NS = "0123456789abcdef0123456789abcdef"
Opener = Callable[..., BackendHandle]


def blob(size: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + size).randbytes(size)


def options(url: str, **over: Any) -> dict[str, Any]:
    # no config loader runs here: every option is passed, defaults included
    opts: dict[str, Any] = {
        "url": url,
        "capacity": None,
        "fsync": False,
        "io_threads": 4,
        "storage_options": {},
    }
    opts.update(over)
    return opts

def open_fs(root: Path, handles: list[BackendHandle], namespace: str = NS,
            **over: Any) -> BackendHandle:
    """An fs tier on the folder ``root``, open on ``namespace``, ``over`` over the defaults of
    :func:`options`; added to ``handles`` (the ``handles`` fixture closes them)."""
    handle = default_registry().create("fs")
    handle.open(options(f"file://{root}", **over), namespace)
    handles.append(handle)
    return handle


def block_path(url: str, key: bytes, namespace: str = NS) -> str:
    h = key.hex()
    return f"{url.removeprefix('file://')}/{namespace}/{h[0:2]}/{(h[2:4] or '00')}/{h}.kvb"


def files_under(url: str) -> list[str]:
    """Every file under a local root but the shared pool's index (``.kvtier-pool.db*``)."""
    root = url.removeprefix("file://")
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                  if not f.startswith(DB_NAME))


def as_bytes(data: BytesLike | None) -> bytes | None:
    return None if data is None else bytes(data)


def store_of(handle: BackendHandle) -> LocalStore:
    """The local store under an open ``fs`` backend (to find its files, or its settings)."""
    store = handle.instance._store
    assert isinstance(store, LocalStore)
    return store


def files_on_disk(root: Path, ns: str = NS) -> dict[bytes, int]:
    """Key -> size of the block files of ``ns`` under a local root, read around the backend
    (a file evicted while the folders are walked is not on disk)."""
    out = {}
    for folder, _, names in os.walk(root / ns):
        for name in names:
            if name.endswith(".kvb"):
                with contextlib.suppress(FileNotFoundError):
                    out[bytes.fromhex(name[:-4])] = os.stat(os.path.join(folder, name)).st_size
    return out


def block_file(root: Path, key: bytes) -> Path:
    """The one file holding ``key``'s block under ``root``, whatever its namespace."""
    found = list(root.rglob(f"{key.hex()}.kvb"))
    assert len(found) == 1, found
    return found[0]


def counted_get_into(chain: Any) -> list[int]:
    """The batch sizes of the first tier's get_into calls, as the chain makes them."""
    handle = chain.tiers[0].handle
    calls: list[int] = []
    real = handle.get_into

    def get_into(keys: Any, buffers: Any) -> Any:
        calls.append(len(keys))
        return real(keys, buffers)

    handle.get_into = get_into
    return calls
