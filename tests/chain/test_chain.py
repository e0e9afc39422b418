"""Tier chains over real backends: reads, promotion, write policies, faults, jobs."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from worker_threads import run_workers

import kvtier
from kvtier import Namespace, open_chain
from kvtier.block import framing
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import BackendError, Capabilities, ClosedError, hookimpl

NS = Namespace("chain-test", dtype="bfloat16", tokens_per_block=32)
BLOCK = 4096


def key(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"k"


def block(i: int, size: int = BLOCK) -> bytes:
    return (i.to_bytes(4, "big") * (size // 4 + 1))[:size]


def read(chain: kvtier.Chain, keys: Sequence[bytes], size: int = BLOCK) -> list[bytes | None]:
    outs = [bytearray(size) for _ in keys]
    found = chain.get(keys, outs)
    return [bytes(o) if f else None for o, f in zip(outs, found)]


def host_fs(
    tmp_path: Path, *, ram: int, disk: str = "1GiB", write: str = "back", codec: str = "none"
) -> dict[str, Any]:
    return {
        "chain": [
            {"name": "ram", "backend": "host", "capacity": ram, "eviction": "lru"},
            {
                "name": "disk",
                "backend": "fs",
                "url": f"file://{tmp_path}/disk",
                "capacity": disk,
                "write": write,
                "codec": codec,
            },
        ]
    }


def test_put_get_round_trip_single_host_tier() -> None:
    cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]}
    with open_chain(cfg, namespace=NS) as chain:
        keys = [key(i) for i in range(10)]
        assert chain.put(keys, [block(i) for i in range(10)]) == [True] * 10
        assert read(chain, keys) == [block(i) for i in range(10)]
        assert read(chain, [key(99)]) == [None]
        assert chain.lookup([key(3), key(99)]) == [0, None]


def test_write_back_demotes_everything_evicted(tmp_path: Path) -> None:
    """RAM holds 4 blocks; 40 puts push 36 down to disk, none is lost."""
    with open_chain(host_fs(tmp_path, ram=4 * BLOCK + 1000), namespace=NS) as chain:
        for i in range(40):
            assert chain.put([key(i)], [block(i)]) == [True]
        chain.flush()
        where = chain.lookup([key(i) for i in range(40)])
        assert where.count(0) == 4 and where.count(1) == 36
        ram, disk = chain.stats()["tiers"]
        assert ram["evictions"] == 36 and disk["demoted"] == 36
        assert read(chain, [key(i) for i in range(40)]) == [block(i) for i in range(40)]
        chain.flush()  # reading promoted blocks into RAM, which demoted others again
        assert chain.stats()["tiers"][0]["backend_stats"]["used_bytes"] <= 4 * BLOCK + 1000


def test_close_saves_what_ram_holds_to_its_write_back_tier(tmp_path: Path) -> None:
    """Blocks only RAM held (never evicted) reach disk at close, through each level."""
    config = host_fs(tmp_path, ram=4 * BLOCK + 1000)
    config["chain"].insert(1, {"name": "ram2", "backend": "host", "capacity": 2 * BLOCK + 1000,
                               "write": "back"})
    with open_chain(config, namespace=NS) as chain:
        assert chain.put([key(i) for i in range(10)], [block(i) for i in range(10)]) == [True] * 10
        assert chain.evict([key(9)]) == 1  # evicted on purpose: must not come back
        chain.flush()
        assert chain.lookup([key(i) for i in range(6, 9)]) == [0, 0, 0]
    with open_chain(config, namespace=NS) as chain:  # both RAM tiers start empty
        assert chain.lookup([key(i) for i in range(10)]) == [2] * 9 + [None]
        assert read(chain, [key(i) for i in range(9)]) == [block(i) for i in range(9)]


def test_get_bytes_needs_no_sizes_and_promotes(tmp_path: Path) -> None:
    with open_chain(host_fs(tmp_path, ram=1 << 20, write="through"), namespace=NS) as chain:
        chain.put([key(1), key(2)], [block(1, 100), block(2, 7)])
        chain.flush()
        chain.tiers[0].evict([key(2)])
        assert chain.get_bytes([key(1), key(2), key(3)]) == [block(1, 100), block(2, 7), None]
        chain.flush()
        assert chain.lookup([key(2)]) == [0]


def test_write_through_copies_to_disk_at_once(tmp_path: Path) -> None:
    with open_chain(host_fs(tmp_path, ram=1 << 20, write="through"), namespace=NS) as chain:
        chain.put([key(i) for i in range(8)], [block(i) for i in range(8)])
        chain.flush()
        disk = chain.tiers[1]
        assert disk.lookup([key(i) for i in range(8)]) == [True] * 8
    # a new chain over the same directory, without the RAM tier, has them all
    only_disk = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/disk"}]}
    with open_chain(only_disk, namespace=NS) as chain:
        assert read(chain, [key(i) for i in range(8)]) == [block(i) for i in range(8)]


def test_hits_below_are_promoted(tmp_path: Path) -> None:
    with open_chain(host_fs(tmp_path, ram=1 << 20, write="through"), namespace=NS) as chain:
        chain.put([key(1)], [block(1)])
        chain.flush()
        chain.tiers[0].evict([key(1)])
        assert chain.lookup([key(1)]) == [1]
        assert read(chain, [key(1)]) == [block(1)]
        chain.flush()
        assert chain.lookup([key(1)]) == [0]
        assert chain.stats()["tiers"][0]["promoted"] == 1


def test_codec_per_tier_and_recoding_on_demotion(tmp_path: Path) -> None:
    cfg = host_fs(tmp_path, ram=2 * 65536 + 1000, codec="zstd")
    zeros = bytes(65536)
    with open_chain(cfg, namespace=NS) as chain:
        for i in range(6):
            chain.put([key(i)], [zeros[:-8] + i.to_bytes(8, "big")])
        chain.flush()
        files = list((tmp_path / "disk").rglob("*.kvb"))
        assert files and all(f.stat().st_size < 65536 // 10 for f in files)
        got = read(chain, [key(i) for i in range(6)], size=65536)
        assert got == [zeros[:-8] + i.to_bytes(8, "big") for i in range(6)]


def test_corrupt_block_on_disk_is_a_miss_and_counted(tmp_path: Path) -> None:
    cfg = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/d"}]}
    with open_chain(cfg, namespace=NS) as chain:
        chain.put([key(1), key(2)], [block(1), block(2)])
        (path,) = [p for p in (tmp_path / "d").rglob("*.kvb") if p.name.startswith(key(1).hex())]
        data = bytearray(path.read_bytes())
        data[-10] ^= 0xFF
        path.write_bytes(bytes(data))
        assert read(chain, [key(1), key(2)]) == [None, block(2)]
        assert chain.stats()["tiers"][0]["corrupt"] == 1


@pytest.mark.parametrize("mode", ["one-pass", "two-passes"])
def test_host_reads_check_every_block_whichever_way_they_copy(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one pass: get() and the C copy that checksums; two: scatter-read in
    # cache-sized runs, then checksum.  A 6 x ~2 MiB batch spans several runs.
    if mode == "two-passes":
        monkeypatch.setattr(framing, "_xxh3copy", None)
    elif not framing.checks_while_copying():
        pytest.skip("kvtier.block._xxh3copy is not built")
    sizes = [2 << 20, (2 << 20) + 5, 300, 100, 1 << 20, 2 << 20]
    keys = [key(i) for i in range(len(sizes))]
    blocks = [os.urandom(size) for size in sizes]
    cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "64MiB"}]}
    with open_chain(cfg, namespace=NS) as chain:
        assert chain.put(keys, blocks) == [True] * len(keys)
        handle = chain.tiers[0].handle
        for i in (1, 3):  # a long payload and a short one, a byte flipped mid-payload
            assert handle.tamper(keys[i], lambda b, n=sizes[i]: flip(b, len(b) - n // 2))
        outs = [bytearray(size) for size in sizes]
        assert chain.get(keys, outs) == [True, False, True, False, True, True]
        assert [bytes(outs[i]) for i in (0, 2, 4, 5)] == [blocks[i] for i in (0, 2, 4, 5)]
        assert chain.stats()["tiers"][0]["corrupt"] == 2
        assert chain.lookup(keys) == [0, None, 0, None, 0, 0]  # the damaged ones dropped
        # blocks of unknown size go through the same check
        assert handle.tamper(keys[0], lambda b: flip(b, len(b) - 1))
        assert chain.get_bytes([keys[0], keys[2]]) == [None, blocks[2]]
        assert chain.stats()["tiers"][0]["corrupt"] == 3


def flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x01
    return bytes(out)


def test_other_namespace_never_sees_blocks(tmp_path: Path) -> None:
    cfg = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/d"}]}
    with open_chain(cfg, namespace=NS) as chain:
        chain.put([key(1)], [block(1)])
    other = Namespace("chain-test", dtype="float16", tokens_per_block=32)
    with open_chain(cfg, namespace=other) as chain:
        assert read(chain, [key(1)]) == [None]


def test_prefix_hits_counts_leading_keys_in_any_tier(tmp_path: Path) -> None:
    with open_chain(host_fs(tmp_path, ram=1 << 20, write="through"), namespace=NS) as chain:
        keys = [key(i) for i in range(6)]
        chain.put(keys[:4], [block(i) for i in range(4)])
        chain.flush()
        chain.tiers[0].evict(keys[1:3])  # now only on disk
        assert chain.prefix_hits(keys) == 4
        assert chain.prefix_hits([key(9), *keys]) == 0
        assert chain.prefix_hits([]) == 0


def test_evict_removes_from_every_tier(tmp_path: Path) -> None:
    with open_chain(host_fs(tmp_path, ram=1 << 20, write="through"), namespace=NS) as chain:
        chain.put([key(1), key(2)], [block(1), block(2)])
        assert chain.evict([key(1), key(3)]) == 1
        assert chain.lookup([key(1), key(2)]) == [None, 0]
        assert chain.evict_each([key(3), key(2), key(1)]) == [False, True, False]
        assert chain.lookup([key(2)]) == [None]
        assert read(chain, [key(1)]) == [None]


def test_block_too_big_for_ram_falls_through_to_disk(tmp_path: Path) -> None:
    with open_chain(host_fs(tmp_path, ram=BLOCK * 2), namespace=NS) as chain:
        big = block(7, BLOCK * 4)
        assert chain.put([key(7)], [big]) == [True]
        assert chain.lookup([key(7)]) == [1]
        assert read(chain, [key(7)], size=BLOCK * 4) == [big]


def test_bad_arguments_are_errors_not_misses() -> None:
    cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]}
    with open_chain(cfg, namespace=NS) as chain:
        with pytest.raises(ValueError, match="1 to 64"):
            chain.put([b""], [b"x"])
        with pytest.raises(ValueError, match="1 to 64"):
            chain.lookup([b"k" * 65])
        with pytest.raises(TypeError, match="bytes"):
            chain.lookup(["text"])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="2 blocks for 1 keys"):
            chain.put([key(1)], [b"a", b"b"])
        with pytest.raises(TypeError, match="writable"):
            chain.get([key(1)], [b"readonly"])


def test_close_is_idempotent_and_use_after_close_fails() -> None:
    chain = open_chain(
        {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]}, namespace=NS
    )
    chain.close()
    chain.close()
    with pytest.raises(ClosedError):
        chain.put([key(1)], [b"x"])
    with pytest.raises(ClosedError):
        chain.submit_lookup([key(1)])


def test_async_jobs_complete_and_are_polled_once(tmp_path: Path) -> None:
    with open_chain(host_fs(tmp_path, ram=1 << 20), namespace=NS) as chain:
        keys = [key(i) for i in range(16)]
        put_id = chain.submit_put(keys, [block(i) for i in range(16)])
        assert chain.wait([put_id], timeout=30)
        outs = [bytearray(BLOCK) for _ in keys]
        get_id = chain.submit_get([*keys, key(99)], [*outs, bytearray(BLOCK)])
        look_id = chain.submit_lookup([key(0), key(99)])
        assert chain.wait(timeout=30)
        results = {r.job_id: r for r in chain.poll()}
        assert results[put_id].result == [True] * 16 and results[put_id].kind == "put"
        assert results[get_id].result == [True] * 16 + [False]
        assert results[look_id].result == [0, None]
        assert [bytes(o) for o in outs] == [block(i) for i in range(16)]
        assert chain.poll() == []


# --- faults: a backend that can be switched off -------------------------------------------


class Switchable:
    """A dict store whose every hook raises while ``down`` is set."""

    down = threading.Event()

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def _check(self) -> None:
        if self.down.is_set():
            raise BackendError("switched off")

    @hookimpl
    def kvtier_put(self, keys: Sequence[bytes], blocks: Sequence[Any]) -> list[bool]:
        self._check()
        for k, b in zip(keys, blocks):
            self.data[k] = bytes(b)
        return [True] * len(keys)

    @hookimpl
    def kvtier_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        self._check()
        return [self.data.get(k) for k in keys]

    @hookimpl
    def kvtier_lookup(self, keys: Sequence[bytes]) -> list[bool]:
        self._check()
        return [k in self.data for k in keys]

    @hookimpl
    def kvtier_evict(self, keys: Sequence[bytes]) -> list[bool]:
        self._check()
        return [self.data.pop(k, None) is not None for k in keys]


def test_failing_tier_becomes_misses_and_recovers(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvtier.chain.health as tier_module
    from kvtier.backends.host import HostBackend

    monkeypatch.setattr(tier_module, "_BACKOFF_FIRST", 0.05)
    registry = BackendRegistry()
    registry.register("switchable", Switchable)
    registry.register("host", HostBackend)
    cfg = {
        "chain": [
            {"name": "flaky", "backend": "switchable"},
            {"name": "ram", "backend": "host", "capacity": "1MiB", "write": "through"},
        ]
    }
    Switchable.down.clear()
    with open_chain(cfg, namespace=NS, registry=registry) as chain:
        chain.put([key(1)], [block(1)])
        chain.flush()
        Switchable.down.set()
        # the failing tier is skipped, the block comes from the RAM tier below
        assert read(chain, [key(1)]) == [block(1)]
        flaky = chain.stats()["tiers"][0]
        assert flaky["errors"] == 1 and not flaky["healthy"]
        assert chain.put([key(2)], [block(2)]) == [True]  # falls through to RAM
        Switchable.down.clear()
        deadline = time.monotonic() + 10
        while not chain.tiers[0].healthy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert chain.put([key(3)], [block(3)]) == [True]
        assert chain.lookup([key(3)]) == [0]  # back in service


def test_many_threads_never_see_wrong_bytes(tmp_path: Path) -> None:
    cfg = host_fs(tmp_path, ram=16 * BLOCK)
    errors: list[str] = []
    with open_chain(cfg, namespace=NS) as chain:

        def worker(seed: int) -> None:
            rng = __import__("random").Random(seed)
            for _ in range(150):
                i = rng.randrange(64)
                op = rng.random()
                if op < 0.5:
                    chain.put([key(i)], [block(i)])
                elif op < 0.95:
                    got = read(chain, [key(i)])[0]
                    if got is not None and got != block(i):
                        errors.append(f"key {i}: wrong bytes")
                else:
                    chain.evict([key(i)])

        run_workers(worker, 6)
        assert errors == []
        assert chain.stats()["tiers"][0]["backend_stats"]["used_bytes"] <= 16 * BLOCK


def test_chain_stats_have_the_documented_fields(tmp_path: Path) -> None:
    with open_chain(host_fs(tmp_path, ram=1 << 20), namespace=NS) as chain:
        chain.put([key(1)], [block(1)])
        read(chain, [key(1), key(2)])
        stats = chain.stats()
        assert stats["namespace"] == NS.hex
        ram = stats["tiers"][0]
        assert (ram["hits"], ram["misses"], ram["bytes_in"], ram["bytes_out"]) == (
            1,
            1,
            BLOCK,
            BLOCK,
        )
        assert ram["latency"]["get"]["count"] >= 1 and ram["healthy"]
        disk = stats["tiers"][1]
        assert disk["misses"] == 1


def test_blobs_put_unverified_are_checked_when_read() -> None:
    """``put_blobs(verify=False)``, as ``kvtier serve`` stores a client's blocks: the
    header is still checked on the way in, the payload's checksum when it is read."""
    config = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]}
    with open_chain(config, namespace=NS) as source:
        source.put([key(0), key(1)], [block(0), block(1)])
        good, rotten = source.tiers[0].get_blobs([key(0), key(1)])
    assert good is not None and rotten is not None
    damaged = bytearray(rotten)
    damaged[-1] ^= 0x40  # the payload's last byte
    with open_chain(config, namespace=NS) as server:
        assert server.put_blobs([key(1)], [bytes(damaged)]) == [False]  # checked by default
        stored = server.put_blobs([key(0), key(1), key(2)], [good, bytes(damaged), good],
                                  verify=False)
        assert stored == [True, True, False]  # the last names another key
        kept = server.tiers[0].handle.get([key(0)])[0]
        assert kept is good  # bytes are stored as they came, not copied
        # refused on the way in: the damaged payload checked, and the wrong key
        assert server.stats()["tiers"][0]["corrupt"] == 2
        assert read(server, [key(0), key(1)]) == [block(0), None]
        assert server.stats()["tiers"][0]["corrupt"] == 3  # the damage, found by the read


def test_blobs_move_between_chains_of_one_namespace(tmp_path: Path) -> None:
    """What `kvtier serve` does: framed blocks pass through a chain that knows only the hex."""
    source_cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]}
    server_cfg = host_fs(tmp_path, ram=2 * BLOCK + 500, codec="zstd")
    with open_chain(source_cfg, namespace=NS) as source:
        source.put([key(i) for i in range(5)], [block(i) for i in range(5)])
        blobs = source.tiers[0].get_blobs([key(i) for i in range(5)])
    server_ns = Namespace.from_hex(NS.hex)
    assert server_ns.fingerprint == NS.fingerprint
    with open_chain(server_cfg, namespace=server_ns) as server:
        assert server.put_blobs([key(i) for i in range(5)], blobs) == [True] * 5  # type: ignore[arg-type]
        assert server.put_blobs([key(9)], [blobs[0]]) == [False]  # header names another key
        server.flush()
        served = server.get_blobs([key(i) for i in range(6)])
        assert served[5] is None
    with open_chain(source_cfg, namespace=NS) as reader:
        for i, blob in enumerate(served[:5]):
            assert blob is not None
            reader.tiers[0].put_blobs([key(i)], [blob])
        assert read(reader, [key(i) for i in range(5)]) == [block(i) for i in range(5)]
    other = Namespace("another-model")
    with open_chain(source_cfg, namespace=other) as chain:
        assert chain.put_blobs([key(0)], [blobs[0]]) == [False]  # type: ignore[list-item]
    with pytest.raises(ValueError, match="32 lowercase hex"):
        Namespace.from_hex("zz")


class OneAtATime(Switchable):
    """Declares thread_safe=False and records whether two calls ever overlapped."""

    active = 0
    overlaps = 0
    guard = threading.Lock()

    @hookimpl
    def kvtier_capabilities(self) -> Capabilities:
        return Capabilities(thread_safe=False)

    def _check(self) -> None:
        cls = OneAtATime
        with cls.guard:
            cls.active += 1
            if cls.active > 1:
                cls.overlaps += 1
        time.sleep(0.0005)  # widen the window an overlap would need
        with cls.guard:
            cls.active -= 1


def test_backends_that_are_not_thread_safe_get_one_call_at_a_time() -> None:
    registry = BackendRegistry()
    registry.register("serial", OneAtATime)
    cfg = {"chain": [{"name": "s", "backend": "serial"}]}
    with open_chain(cfg, namespace=NS, registry=registry) as chain:

        def worker(base: int) -> None:
            for i in range(40):
                chain.put([key(base + i)], [block(base + i)])
                assert read(chain, [key(base + i)]) == [block(base + i)]

        threads = [threading.Thread(target=worker, args=(n * 100,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert OneAtATime.overlaps == 0


def test_blocks_being_demoted_stay_readable(tmp_path: Path) -> None:
    """Between eviction from RAM and landing on disk, a block is still served."""
    cfg = {"chain": [
        {"name": "ram", "backend": "host", "capacity": 3 * BLOCK + 500},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/d", "write": "back"},
    ]}
    with open_chain(cfg, namespace=NS) as chain:
        for i in range(200):
            chain.put([key(i)], [block(i)])
            if i >= 4:  # just pushed out of RAM, demotion possibly still queued
                assert chain.lookup([key(i - 4)]) != [None]
                assert read(chain, [key(i - 4)]) == [block(i - 4)]
                assert chain.get_bytes([key(i - 4)]) == [block(i - 4)]


class _SlowFs:
    """Stands in for the fs backend below RAM; its puts wait until released."""

    release = threading.Event()

    @classmethod
    def make(cls) -> Any:
        from kvtier.backends.fs import FsBackend

        class Slow(FsBackend):
            def _put(self, *args: Any) -> list[bool]:
                assert cls.release.wait(30), "never released"
                result: list[bool] = super()._put(*args)
                return result

        return Slow()


def test_block_written_through_is_readable_before_the_write_lands(tmp_path: Path) -> None:
    """RAM evicts a block while its write-through copy is still queued: it must not vanish."""
    registry = BackendRegistry()
    registry.register("slowfs", _SlowFs.make)
    config = {"chain": [
        {"name": "ram", "backend": "host", "capacity": BLOCK + 1000},
        {"name": "disk", "backend": "slowfs", "url": f"file://{tmp_path}/disk",
         "write": "through"},
    ]}
    _SlowFs.release.clear()
    with open_chain(config, namespace=NS, registry=registry) as chain:
        try:
            for i in range(3):  # each put evicts the one before from RAM
                assert chain.put([key(i)], [block(i)]) == [True]
            assert chain.stats()["tiers"][0]["evictions"] == 2
            assert read(chain, [key(0), key(1), key(2)]) == [block(0), block(1), block(2)]
            assert chain.get_bytes([key(0)]) == [block(0)]
        finally:
            _SlowFs.release.set()
        assert chain.flush(30)
        assert chain.lookup([key(0), key(1)]) == [1, 1]
        assert read(chain, [key(0), key(1)]) == [block(0), block(1)]
