"""A full disk under an fs tier: every block of every put is counted once, and
writes go on as soon as an eviction frees room (a 16 MiB tmpfs the test mounts)."""

from __future__ import annotations

from pathlib import Path

import kvtier

NAMESPACE = kvtier.Namespace("full-disk", dtype="bfloat16", tokens_per_block=16)
MIB = 1 << 20


def payload(i: int) -> bytes:
    return bytes([i % 251 + 1]) * (MIB - 8) + i.to_bytes(8, "big")


def test_full_disk_counts_each_block_and_writes_resume_when_room_is_freed(tmpfs: Path) -> None:
    tier = {"name": "disk", "backend": "fs", "url": str(tmpfs), "direct_io": False}
    with kvtier.open_chain({"chain": [tier]}, namespace=NAMESPACE) as chain:
        stored: list[bytes] = []
        attempted = 40  # blocks of 1 MiB: 16 MiB holds 15 at most
        for i in range(attempted):
            key = b"full-%03d" % i
            if chain.put([key], [payload(i)]) == [True]:
                stored.append(key)
        figures = chain.stats()["tiers"][0]
        assert 0 < len(stored) < attempted  # the disk really filled
        # each block offered once, in exactly one figure
        assert figures["puts"] == len(stored)
        assert figures["failed"] == attempted - len(stored)
        assert figures["refused"] == 0
        assert figures["errors"] >= 1 and figures["healthy"] is False  # backed off
        # an eviction frees room: the very next store goes through
        assert chain.evict(stored[:3]) == 3
        assert chain.put([b"after"], [payload(99)]) == [True]
        outs = [bytearray(MIB) for _ in range(len(stored) - 2)]
        assert chain.get([*stored[3:], b"after"], outs) == [True] * len(outs)
        expected = [*(payload(int(k[-3:])) for k in stored[3:]), payload(99)]
        assert [bytes(o) for o in outs] == expected
        assert chain.stats()["tiers"][0]["healthy"] is True
