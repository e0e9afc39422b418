"""Foreign data: blocks of another namespace (model or layout) are never returned.

Two ways a block can meet the wrong reader: two namespaces sharing a
directory or bucket (the normal case, kept apart by the namespace in the
path), and a block copied verbatim into the other namespace's place (a
misplaced copy, a hand-moved directory).  The second only the fingerprint
in the header stops; both must give misses, never the foreign bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from faultkit import Report, object_tier, read_exact
from seaweed import SeaweedServer

import kvtier
from kvtier.testing.data import block_for

WRITER = kvtier.Namespace("model-a", dtype="bfloat16", tokens_per_block=16, kv_layout="NHD",
                          parallel_layout="tp1-rank0")
READERS = {
    "model": kvtier.Namespace("model-b", dtype="bfloat16", tokens_per_block=16,
                              kv_layout="NHD", parallel_layout="tp1-rank0"),
    "dtype": kvtier.Namespace("model-a", dtype="float16", tokens_per_block=16,
                              kv_layout="NHD", parallel_layout="tp1-rank0"),
    "tokens_per_block": kvtier.Namespace("model-a", dtype="bfloat16", tokens_per_block=32,
                                         kv_layout="NHD", parallel_layout="tp1-rank0"),
    "kv_layout": kvtier.Namespace("model-a", dtype="bfloat16", tokens_per_block=16,
                                  kv_layout="HND", parallel_layout="tp1-rank0"),
    "parallel_layout": kvtier.Namespace("model-a", dtype="bfloat16", tokens_per_block=16,
                                        kv_layout="NHD", parallel_layout="tp2-rank0"),
}
SIZE = 8192


def tiers(tmp_path: Path, s3_server: SeaweedServer, bucket: str) -> dict[str, dict[str, Any]]:
    return {
        "host": {"name": "t", "backend": "host", "capacity": "64MiB"},
        "fs": {"name": "t", "backend": "fs", "url": f"file://{tmp_path}/shared"},
        "fs-zstd": {"name": "t", "backend": "fs", "url": f"file://{tmp_path}/shared-z",
                    "codec": "zstd"},
        "object": {**object_tier(s3_server, bucket), "name": "t"},
    }


@pytest.mark.parametrize("backend", ["host", "fs", "fs-zstd", "object"])
def test_foreign_blocks_are_never_returned(
    tmp_path: Path, s3_server: SeaweedServer, bucket: str, fault_report: Report, backend: str
) -> None:
    tier = tiers(tmp_path, s3_server, bucket)[backend]
    keys = [f"foreign/{i}".encode() for i in range(24)]
    blocks = [block_for(k, SIZE) for k in keys]
    attempts = returned = 0
    with kvtier.open_chain({"chain": [tier]}, namespace=WRITER) as writer:
        assert writer.put(keys, blocks) == [True] * len(keys)
        framed = list(writer.tiers[0].handle.get(keys))
        assert all(b is not None for b in framed)
        for field, namespace in READERS.items():
            with kvtier.open_chain({"chain": [tier]}, namespace=namespace) as reader:
                shared = read_exact(reader, keys, [SIZE] * len(keys))
                # the writer's framed blocks, copied verbatim under the reader's namespace
                evicted: list[Any] = []
                assert list(reader.tiers[0].handle.put(keys, framed, evicted)) == [True] * 24
                copied = read_exact(reader, keys, [SIZE] * len(keys))
                as_bytes = reader.get_bytes(keys)
                corrupt = reader.stats()["tiers"][0]["corrupt"]
                dropped = reader.lookup(keys)
            attempts += 3 * len(keys)
            returned += sum(g is not None for g in shared + copied + as_bytes)
            assert shared == copied == as_bytes == [None] * len(keys), field
            # each copied block rejected by the first read and dropped from the tier
            assert corrupt == len(keys), field
            assert dropped == [None] * len(keys), field
        # the writer still reads its own blocks
        assert read_exact(writer, keys, [SIZE] * len(keys)) == blocks
    fault_report.record(f"foreign_{backend}", "ci", attempts=attempts, returned=returned,
                        namespaces=len(READERS))
