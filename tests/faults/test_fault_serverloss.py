"""Server loss: SeaweedFS and a ``kvtier serve`` peer die under a running chain.

The chain must keep answering (the RAM tier's blocks as hits, the lost
tier's as misses), never raise, and use the lost tier again by itself once
its server is back: nobody reopens anything.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

from faultkit import Report, block_for, object_tier, read_exact, wait_for
from peer_server import PeerServer
from seaweed import SeaweedServer

import kvtier

NS = kvtier.Namespace("loss-model", dtype="bfloat16", tokens_per_block=16)


def blocks_of(tag: str, n: int, size: int) -> tuple[list[bytes], list[bytes]]:
    keys = [f"loss/{tag}/{i}".encode() for i in range(n)]
    return keys, [block_for(k, size) for k in keys]


def test_seaweedfs_killed_and_restarted(
    tmp_path: Path, fault_report: Report, fast_recovery: None
) -> None:
    server = SeaweedServer(tmp_path / "weed")  # private: this test kills it
    server.start()
    try:
        bucket = server.make_bucket("kvt-loss")
        config = {"chain": [
            {"name": "ram", "backend": "host", "capacity": "256MiB", "promote": False},
            object_tier(server, bucket, request_timeout="2s", connect_timeout="1s"),
        ]}
        size = 64 * 1024
        below, below_blocks = blocks_of("below", 16, size)  # only in the object tier
        ram, ram_blocks = blocks_of("ram", 16, size)
        with kvtier.open_chain(config, namespace=NS) as chain:
            assert chain.put(below, below_blocks) == [True] * 16
            assert chain.flush(120)
            assert chain.tiers[0].evict(below) == [True] * 16
            assert chain.put(ram, ram_blocks) == [True] * 16
            assert chain.flush(120)

            server.kill()
            ops = 0
            for round_ in range(4):  # every call answers, none raises
                assert read_exact(chain, ram, [size] * 16) == ram_blocks
                assert read_exact(chain, below, [size] * 16) == [None] * 16
                extra, extra_blocks = blocks_of(f"outage{round_}", 4, size)
                assert chain.put(extra, extra_blocks) == [True] * 4
                assert chain.lookup(ram[:2]) == [0, 0]
                ops += 4
            chain.flush(120)
            outage = chain.stats()["tiers"][1]
            assert outage["errors"] > 0

            restarted = time.monotonic()
            server.start()
            wait_for(lambda: read_exact(chain, below[:1], [size]) == below_blocks[:1],
                     "the object tier to serve again after the restart", timeout=120)
            recovery_s = time.monotonic() - restarted
            assert read_exact(chain, below, [size] * 16) == below_blocks
            later, later_blocks = blocks_of("later", 4, size)
            assert chain.put(later, later_blocks) == [True] * 4
            assert chain.flush(120)
            assert chain.tiers[1].lookup(later) == [True] * 4  # written through again
    finally:
        server.kill()
    fault_report.record("loss_seaweedfs", "ci", ops_during_outage=ops, raised=0,
                        errors_counted=outage["errors"], recovered=True,
                        recovery_s=round(recovery_s, 2))


def test_peer_killed_mid_transfer(
    tmp_path: Path, fault_report: Report, fast_recovery: None
) -> None:
    node = {"chain": [{"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/node-disk"}]}
    size = 1 << 20
    below, below_blocks = blocks_of("peer", 24, size)
    ram, ram_blocks = blocks_of("peer-ram", 8, size)
    srv = PeerServer(tmp_path / "node", config=node).start()
    again: PeerServer | None = None
    try:
        peer = {"name": "peer", "backend": "peer", "peers": [srv.address],
                "request_timeout": "2s", "connections": 1}
        config = {"chain": [
            {"name": "ram", "backend": "host", "capacity": "256MiB", "promote": False}, peer]}
        with kvtier.open_chain(config, namespace=NS) as chain:
            assert chain.put(below, below_blocks) == [True] * 24
            assert chain.flush(120)
            assert chain.tiers[0].evict(below) == [True] * 24
            assert chain.put(ram, ram_blocks) == [True] * 8

            def requests() -> Any:
                return chain.stats()["tiers"][1]["backend_stats"]["requests"]

            sent = requests()
            result: list[list[bytes | None]] = []
            srv.signal(signal.SIGSTOP)  # frozen: the batch below is surely in flight
            getter = threading.Thread(
                target=lambda: result.append(read_exact(chain, below, [size] * 24)))
            getter.start()
            wait_for(lambda: requests() > sent, "the GET to go out")
            srv.kill()
            getter.join(120)
            assert not getter.is_alive()
            got = result[0]
            assert all(g is None or g == b for g, b in zip(got, below_blocks))
            assert read_exact(chain, ram, [size] * 8) == ram_blocks  # RAM keeps answering

            again = PeerServer(tmp_path / "node", config=node,
                               listen=f"127.0.0.1:{srv.port}").start()
            restarted = time.monotonic()
            try:
                wait_for(lambda: read_exact(chain, below[:1], [size]) == below_blocks[:1],
                         "hits from the restarted peer", timeout=120)
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}; server running: {again.running()}; peer tier: "
                    f"{chain.stats()['tiers'][1]}; server log:\n{again.log()[-3000:]}") from None
            recovery_s = time.monotonic() - restarted
            assert read_exact(chain, below, [size] * 24) == below_blocks
    finally:
        srv.kill()
        if again is not None:
            again.stop()
    fault_report.record("loss_peer", "ci", in_flight_keys=24,
                        in_flight_wrong=0, in_flight_served=sum(g is not None for g in got),
                        raised=0, recovered=True, recovery_s=round(recovery_s, 2))
