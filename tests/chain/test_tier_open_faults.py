"""A tier that cannot open does not stop the chain: it starts failed, and opens once it can.

Real parts: an ``object`` tier on a loopback port nobody listens on, then a
real SeaweedFS started on that port; an ``fs`` tier whose root lies under a
file (a directory cannot be made there), then the file replaced by a
directory.  ``required: true`` restores failing at open, and errors
``kvtier config validate`` could name still fail it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fs_fault_child import without_dac
from seaweed import SeaweedServer

import kvtier.chain.health
from kvtier import Chain, open_chain
from kvtier.chain.catalog import CATALOG_HEX
from kvtier.spec import BackendError, ConfigError

KiB = 1024
BLOCK = 4 * KiB


def payload(i: int) -> bytes:
    return random.Random(i).randbytes(BLOCK)


def key(i: int) -> bytes:
    return b"open-fault-%06d" % i


def free_port() -> int:
    """A loopback port free now, that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read(chain: Chain, keys: list[bytes]) -> list[bytes | None]:
    outs = [bytearray(BLOCK) for _ in keys]
    return [bytes(o) if f else None for o, f in zip(outs, chain.get(keys, outs))]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Wait for a state, not for a speed: the bound only ends a test that would hang."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(0.05)


def tier_stats(chain: Chain, name: str) -> dict[str, Any]:
    (stats,) = (t for t in chain.stats()["tiers"] if t["name"] == name)
    return stats


@pytest.fixture(autouse=True)
def short_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries come every 0.05-0.5 s: a tier opens soon after its storage does."""
    monkeypatch.setattr(kvtier.chain.health, "_BACKOFF_FIRST", 0.05)
    monkeypatch.setattr(kvtier.chain.health, "_BACKOFF_MAX", 0.5)


@pytest.fixture
def down_server(tmp_path: Path) -> Iterator[SeaweedServer]:
    """A SeaweedFS whose ports are chosen but which is not started: its S3 port refuses."""
    server = SeaweedServer(tmp_path / "weed")
    try:
        yield server
    finally:
        server.kill()


def object_tier(server: SeaweedServer, bucket: str, **over: Any) -> dict[str, Any]:
    return {"name": "s3", "backend": "object", "bucket": bucket, "endpoint": server.endpoint,
            "access_key_id": server.access_key, "secret_access_key": server.secret_key,
            "region": server.region, "connect_timeout": "1s", "request_timeout": "5s", **over}


def ram_tier(capacity: str = "1MiB") -> dict[str, Any]:
    return {"name": "ram", "backend": "host", "capacity": capacity}


def refuses(server: SeaweedServer) -> bool:
    try:
        urllib.request.urlopen(server.endpoint, timeout=2)
    except OSError as exc:
        return isinstance(getattr(exc, "reason", exc), ConnectionRefusedError)
    return False


# --- object: an endpoint that refuses connections ----------------------------------------


def test_object_tier_on_a_closed_port_starts_failed_and_the_chain_serves(
    down_server: SeaweedServer, caplog: pytest.LogCaptureFixture
) -> None:
    assert refuses(down_server)
    port = free_port()
    config = {"chain": [ram_tier(), object_tier(down_server, "kvt-down")],
              "metrics": {"prometheus_port": port}}
    caplog.set_level(logging.WARNING, "kvtier")
    with open_chain(config, namespace="open-faults") as chain:
        warned = [r.getMessage() for r in caplog.records if "did not open" in r.getMessage()]
        assert len(warned) == 1 and "tier 's3' (object)" in warned[0]
        assert down_server.endpoint in warned[0]
        keys = [key(i) for i in range(8)]
        assert chain.put(keys, [payload(i) for i in range(8)]) == [True] * 8
        assert read(chain, keys) == [payload(i) for i in range(8)]  # the RAM tier serves
        assert read(chain, [key(99)]) == [None]
        assert chain.lookup([key(99)]) == [None]
        chain.flush()
        s3 = tier_stats(chain, "s3")
        assert not s3["healthy"] and down_server.endpoint in s3["last_error"]
        assert s3["puts"] == 0 and s3["failed"] == 8  # written through: skipped, counted
        assert s3["hits"] == 0 and s3["errors"] == 0
        assert tier_stats(chain, "ram")["healthy"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        labels = f'backend="object",namespace="{chain.namespace.hex}",tier="s3"'
        assert f"kvtier_tier_healthy{{{labels}}} 0.0" in text.decode()


def test_object_tier_opens_once_its_server_comes_up_and_takes_blocks(
    down_server: SeaweedServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "kvtier")
    config = {"chain": [ram_tier(), object_tier(down_server, "kvt-late")]}
    with open_chain(config, namespace="open-faults-late") as chain:
        early = [key(i) for i in range(4)]
        assert chain.put(early, [payload(i) for i in range(4)]) == [True] * 4
        down_server.repick_taken_ports()
        down_server.start()
        down_server.make_bucket("kvt-late")
        wait_for(lambda: tier_stats(chain, "s3")["healthy"], "the object tier opened")
        assert any("opened after" in r.getMessage() for r in caplog.records)
        late = [key(i) for i in range(4, 12)]
        assert chain.put(late, [payload(i) for i in range(4, 12)]) == [True] * 8
        chain.flush()
        s3 = tier_stats(chain, "s3")
        assert s3["puts"] == 8 and s3["failed"] == 4
        assert s3["backend_stats"]["uploads"] == 8
    # what the object tier got is there for a chain of it alone, byte for byte
    with open_chain({"chain": [object_tier(down_server, "kvt-late")]},
                    namespace="open-faults-late") as alone:
        assert read(alone, late) == [payload(i) for i in range(4, 12)]
        assert read(alone, early) == [None] * 4  # written while it was down: skipped


def test_write_back_tier_above_keeps_what_it_holds_and_saves_it_once_the_tier_opens(
    down_server: SeaweedServer,
) -> None:
    # 16 blocks of RAM (plus their headers); 40 stored: the first ones are evicted
    ram = ram_tier(f"{16 * (BLOCK + 256)}")
    below = object_tier(down_server, "kvt-back", write="back")
    n = 40
    keys = [key(i) for i in range(n)]
    with open_chain({"chain": [ram, below]}, namespace="open-faults-back") as chain:
        assert chain.put(keys, [payload(i) for i in range(n)]) == [True] * n
        chain.flush()
        got = read(chain, keys)
        kept = [i for i in range(n) if got[i] is not None]
        assert all(got[i] == payload(i) for i in kept)  # exact or a miss
        assert 12 <= len(kept) <= 16 and kept == list(range(n - len(kept), n))
        s3 = tier_stats(chain, "s3")
        assert s3["puts"] == 0 and s3["failed"] == n - len(kept)  # demotions skipped, counted
        assert tier_stats(chain, "ram")["backend_stats"]["used_bytes"] <= 16 * (BLOCK + 256)
        down_server.repick_taken_ports()
        down_server.start()
        down_server.make_bucket("kvt-back")
        wait_for(lambda: tier_stats(chain, "s3")["healthy"], "the object tier opened")
    # closing saved what the RAM tier held into the tier below, now open
    with open_chain({"chain": [object_tier(down_server, "kvt-back")]},
                    namespace="open-faults-back") as alone:
        assert read(alone, [keys[i] for i in kept]) == [payload(i) for i in kept]


def test_required_object_tier_fails_the_open(down_server: SeaweedServer) -> None:
    config = {"chain": [ram_tier(), object_tier(down_server, "kvt-req", required=True)]}
    with pytest.raises(BackendError) as info:
        open_chain(config, namespace="open-faults-required")
    assert down_server.endpoint in str(info.value)


# --- fs: a root that cannot be written ----------------------------------------------------


def test_fs_tier_whose_root_cannot_be_made_starts_failed_then_opens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "mnt"
    blocker.write_text("not a directory")  # the root lies under a file: ENOTDIR
    disk = {"name": "disk", "backend": "fs", "url": f"file://{blocker}/kv"}
    caplog.set_level(logging.WARNING, "kvtier")
    with open_chain({"chain": [ram_tier(), disk]}, namespace="open-faults-fs") as chain:
        assert any("tier 'disk' (fs) did not open" in r.getMessage() for r in caplog.records)
        assert chain.put([key(0)], [payload(0)]) == [True]
        assert read(chain, [key(0)]) == [payload(0)]
        chain.flush()
        disk_stats = tier_stats(chain, "disk")
        assert not disk_stats["healthy"] and disk_stats["failed"] == 1
        blocker.unlink()
        blocker.mkdir()  # the mount appears
        wait_for(lambda: tier_stats(chain, "disk")["healthy"], "the fs tier opened")
        assert chain.put([key(1)], [payload(1)]) == [True]
        chain.flush()
        assert tier_stats(chain, "disk")["puts"] == 1
        # the namespace descriptor is recorded when the tier opens, late as it is
        wait_for((blocker / "kv" / CATALOG_HEX).is_dir, "the namespace descriptor recorded")
    with open_chain({"chain": [disk]}, namespace="open-faults-fs") as alone:
        assert read(alone, [key(0), key(1)]) == [None, payload(1)]


#: Run without DAC override (fs_fault_child.without_dac): an fs root of mode 555 this
#: process cannot write, then made writable by its owner, which this process is.
UNWRITABLE_CHILD = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import kvtier
    import kvtier.chain.health as health
    health._BACKOFF_FIRST, health._BACKOFF_MAX = 0.05, 0.5
    root = Path(sys.argv[1])
    try:
        (root / "probe").touch()
        print(json.dumps({"skip": "mode 555 does not stop this process"}))
        sys.exit(0)
    except PermissionError:
        pass
    disk = {"name": "disk", "backend": "fs", "url": str(root)}
    ram = {"name": "ram", "backend": "host", "capacity": "1MiB"}
    seen = {}
    with kvtier.open_chain({"chain": [ram, disk]}, namespace="open-faults-ro") as chain:
        def stats():
            return next(t for t in chain.stats()["tiers"] if t["name"] == "disk")
        seen["healthy_at_open"] = stats()["healthy"]
        seen["early_stored"] = chain.put([b"k0"], [b"x" * 4096])
        chain.flush()
        seen["failed"] = stats()["failed"]
        root.chmod(0o755)  # its owner may, without DAC override
        deadline = time.monotonic() + 60
        while not stats()["healthy"] and time.monotonic() < deadline:
            time.sleep(0.05)
        seen["healthy_later"] = stats()["healthy"]
        seen["late_stored"] = chain.put([b"k1"], [b"y" * 4096])
        chain.flush()
        seen["puts"] = stats()["puts"]
    with kvtier.open_chain({"chain": [disk]}, namespace="open-faults-ro") as alone:
        outs = [bytearray(4096), bytearray(4096)]
        found = alone.get([b"k0", b"k1"], outs)
        seen["alone"] = [bytes(o).decode()[:1] if f else None for o, f in zip(outs, found)]
    print(json.dumps(seen))
""")


def test_fs_tier_on_a_root_it_cannot_write_starts_failed_then_opens(tmp_path: Path) -> None:
    root = tmp_path / "readonly"
    root.mkdir()
    root.chmod(0o555)
    try:
        proc = without_dac([sys.executable, "-c", UNWRITABLE_CHILD, str(root)])
    finally:
        root.chmod(0o755)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in seen:
        pytest.skip(seen["skip"])
    assert "tier 'disk' (fs) did not open" in proc.stderr
    assert seen == {"healthy_at_open": False, "early_stored": [True], "failed": 1,
                    "healthy_later": True, "late_stored": [True], "puts": 1,
                    "alone": [None, "y"]}


def test_required_fs_tier_fails_the_open(tmp_path: Path) -> None:
    blocker = tmp_path / "mnt"
    blocker.write_text("not a directory")
    disk = {"name": "disk", "backend": "fs", "url": f"file://{blocker}/kv", "required": True}
    with pytest.raises(BackendError, match="cannot create or write"):
        open_chain({"chain": [ram_tier(), disk]}, namespace="open-faults-fs")


def test_an_error_config_validate_could_name_still_fails_the_open(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    disk = {"name": "disk", "backend": "fs", "url": f"file://{missing}", "create": False}
    with pytest.raises(ConfigError, match="does not exist"):
        open_chain({"chain": [ram_tier(), disk]}, namespace="open-faults-config")
    assert not os.path.exists(missing)
