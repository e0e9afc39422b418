"""The ``fs`` backend's faults and misuse: unwritable directories, failed writes, bad URLs,
use after close; and the options and capabilities it declares."""

from __future__ import annotations

import errno
import importlib.util
import os
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fs_blocks import NS, Opener, as_bytes, blob, block_path, files_under, options

from kvtier.plugins.registry import default_registry
from kvtier.spec import BackendError, ClosedError, ConfigError

# ---------------------------------------------------------------------------
# faults
# ---------------------------------------------------------------------------


def _chmod_is_effective(path: Path) -> bool:
    path.chmod(0o555)
    try:
        return not os.access(path, os.W_OK)
    finally:
        path.chmod(0o755)


def test_read_only_directory(tmp_path: Path, opener: Opener) -> None:
    if not _chmod_is_effective(tmp_path):
        pytest.skip("running as root: chmod does not stop writes")
    url = f"file://{tmp_path}/store"
    tier = opener(url)
    fan = Path(block_path(url, b"ro")).parent
    fan.mkdir(parents=True)
    fan.chmod(0o555)
    try:
        # a fault of this block's directory only: refused, counted, no error
        assert tier.put([b"ro"], [blob(100)], []) == [False]
        assert tier.stats()["block_faults"] == 1
        assert list(fan.iterdir()) == []
        assert tier.get([b"ro"]) == [None]
    finally:
        fan.chmod(0o755)
    (tmp_path / "store").chmod(0o555)
    (tmp_path / "store" / NS).chmod(0o555)
    try:
        with pytest.raises(BackendError):
            opener(url)
    finally:
        (tmp_path / "store" / NS).chmod(0o755)
        (tmp_path / "store").chmod(0o755)


def test_failed_write_raises_and_leaves_nothing(
    local_url: str, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = opener(local_url)
    assert all(tier.put([b"before"], [blob(10)], []))

    def full(fd: int, buffers: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "writev", full)
    for keys in ([b"x"], [b"y", b"z", b"before"]):
        with pytest.raises(BackendError) as info:
            tier.put(keys, [blob(5000, i) for i in range(len(keys))], [])
        assert info.value.errno == errno.ENOSPC
        assert isinstance(info.value, OSError)
    monkeypatch.undo()
    assert [os.path.basename(p) for p in files_under(local_url)] == [b"before".hex() + ".kvb"]
    assert tier.get([b"x", b"y", b"before"]) == [None, None, blob(10)]
    assert tier.stats()["used_bytes"] == 10
    assert all(tier.put([b"x"], [blob(5000)], []))


def test_failed_write_on_fsspec_raises(opener: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    root = f"/kvtier-test-{uuid.uuid4().hex}"
    tier = opener(f"memory://{root}")
    mem = fsspec.filesystem("memory")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(mem, "pipe_file", broken)
    try:
        with pytest.raises(BackendError):
            tier.put([b"a", b"b"], [b"1", b"2"], [])
        monkeypatch.undo()
        assert tier.get([b"a", b"b"]) == [None, None]
        assert tier.stats()["used_bytes"] == 0
    finally:
        mem.rm(root, recursive=True)


def test_open_errors(tmp_path: Path) -> None:
    def open_(url: str) -> None:
        default_registry().create("fs").open(options(url), NS)

    with pytest.raises(ConfigError) as info:
        open_("nosuchproto://bucket/x")
    assert info.value.key == "url"
    assert "nosuchproto://bucket/x" in str(info.value)
    with pytest.raises(ConfigError) as info:
        open_("relative/path")
    assert info.value.key == "url"
    with pytest.raises(ConfigError) as info:
        default_registry().create("fs").open(options("memory://x"), "../escape")
    # credentials in a URL never reach the message
    with pytest.raises(ConfigError) as info:
        open_("nosuchproto://user:secret@host/x")
    assert "secret" not in str(info.value)
    # root is a file, not a directory: the url option's check says so (config validate too)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ConfigError) as info:
        open_(str(tmp_path / "file"))
    assert info.value.key == "url" and "is a file, not a directory" in str(info.value)


def test_missing_fsspec_package_is_named() -> None:
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed")
    with pytest.raises(ConfigError) as info:
        default_registry().create("fs").open(options("gcs://bucket/x"), NS)
    assert info.value.key == "url"
    assert "gcsfs" in str(info.value)


def test_closed_backend(url: str) -> None:
    tier = default_registry().create("fs")
    with pytest.raises(ClosedError):
        tier.get([b"k"])
    tier.open(options(url), NS)
    tier.close()
    for call in (
        lambda: tier.put([b"k"], [b"v"], []),
        lambda: tier.put_parts([b"k"], [[b"v"]], []),
        lambda: tier.get([b"k"]),
        lambda: tier.get_into([b"k"], [[]]),
        lambda: tier.lookup([b"k"]),
        lambda: tier.evict([b"k"]),
        lambda: tier.tamper(b"k", bytes),
        tier.stats,
        tier.capabilities,
    ):
        with pytest.raises(ClosedError):
            call()
    tier.close()


def test_capabilities_and_options(url: str, opener: Opener) -> None:
    fresh = default_registry().create("fs")
    opts = fresh.options()
    assert set(opts) == {
        "url", "capacity", "create", "fsync", "io_threads", "direct_io", "storage_options",
        "capacity_scope", "min_free", "pool_lease", "sizing_sample", "eviction", "read_only",
        "tenants", "tenant", "expire",
    }
    # the names a file writes: io_threads is concurrency, pool_lease timeout,
    # and pool is folded into capacity_scope (docs/settings.md)
    assert opts["io_threads"].key == "concurrency" and opts["pool_lease"].key == "timeout"
    assert opts["capacity_scope"].deprecated == ("pool",)
    assert opts["eviction"].default == "lru"
    assert opts["url"].required
    assert opts["storage_options"].secret
    assert opts["io_threads"].default == 4
    caps = opener(url).capabilities()
    local = url.startswith("file://")
    assert caps.persistent is local
    assert caps.shared is local
    assert caps.thread_safe
    assert caps.reports_evictions
    assert caps.capacity is None


def test_plain_path_and_single_thread(tmp_path: Path, opener: Opener) -> None:
    tier = opener(str(tmp_path / "plain"), io_threads=1, fsync=True)
    keys = [f"p{i}".encode() for i in range(10)]
    blocks = [blob(100 * i + 1, i) for i in range(10)]
    assert all(tier.put(keys, blocks, []))
    assert [as_bytes(g) for g in tier.get(keys)] == blocks
    assert os.path.exists(block_path(str(tmp_path / "plain"), keys[0]))
