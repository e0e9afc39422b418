"""``kvtier inspect``, ``scrub`` and ``purge`` against real stores: fs, object on SeaweedFS, Redis.

A chain (RAM over the store) is filled with blocks of two models; the
commands run through click's CliRunner on the chain's own YAML file.  Every
figure they report is checked against what was stored (sizes computed with
the block format independently of the backends), a flipped byte is found by
scrub and removed by ``--repair``, and a purged model is gone while the other
model's blocks still read back byte for byte.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from click.testing import CliRunner, Result
from redis_server import RedisServer
from seaweed import SeaweedServer

import kvtier
from kvtier.block import framing
from kvtier.block.framing import Codec
from kvtier.chain.catalog import CATALOG_HEX
from kvtier.cli import cli
from kvtier.cli.operate import RateLimit
from kvtier.config.chain_config import load_config
from kvtier.plugins.registry import BackendHandle, default_registry

LLAMA = kvtier.Namespace(model="llama-test", dtype="bfloat16", tokens_per_block=32,
                         kv_layout="NHD", parallel_layout="tp1-rank0")
QWEN = kvtier.Namespace(model="qwen-test", dtype="float16", tokens_per_block=16)
N = 12
REDIS_DB = 8


def payloads(ns: kvtier.Namespace) -> dict[bytes, bytes]:
    rng = __import__("random").Random(ns.model)
    tag = ns.model[0].encode()
    return {tag + b"%03d" % i: rng.randbytes(3000 + 97 * i) for i in range(N)}


def stored_size(ns: kvtier.Namespace, key: bytes, payload: bytes, codec: str) -> int:
    width = ns.shuffle_width() if codec == "zstd" else 0
    codec_of = Codec(codec, 1, width, ns.tenant.encode())  # the header names the tenant
    return len(framing.encode(ns.fingerprint, key, payload, codec_of))


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis-operate")) as server:
        yield server


@pytest.fixture(params=["fs", "object", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The lower tier's entry: the store under test."""
    if request.param == "fs":
        yield {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/kv"}
    elif request.param == "object":
        s3: SeaweedServer = request.getfixturevalue("s3_server")
        bucket: str = request.getfixturevalue("bucket")
        yield {"name": "disk", "backend": "object", "bucket": bucket, "endpoint": s3.endpoint,
               "access_key_id": s3.access_key, "secret_access_key": s3.secret_key,
               "region": s3.region, "prefix": "kv", "codec": "zstd"}
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        yield {"name": "disk", "backend": "redis", "url": server.url(REDIS_DB)}
        redis.Redis.from_url(server.url(REDIS_DB)).flushdb()


def write_config(tmp_path: Path, store: dict[str, Any]) -> str:
    path = tmp_path / "chain.yaml"
    ram = {"name": "ram", "backend": "host", "capacity": "4MiB"}
    path.write_text(yaml.safe_dump({"chain": [ram, store]}))
    return str(path)


def fill(config: str) -> None:
    for ns in (LLAMA, QWEN):
        data = payloads(ns)
        with kvtier.open_chain(config, namespace=ns) as chain:
            assert chain.put(list(data), list(data.values())) == [True] * N


def run(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)


def as_json(result: Result) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def disk(document: dict[str, Any]) -> dict[str, Any]:
    (row,) = [t for t in document["tiers"] if t["tier"] == "disk"]
    return row


def read_back(config: str, ns: kvtier.Namespace) -> dict[bytes, bytes | None]:
    keys = list(payloads(ns))
    with kvtier.open_chain(config, namespace=ns) as chain:
        return dict(zip(keys, chain.get_bytes(keys)))


def open_raw(config: str, ns: kvtier.Namespace) -> BackendHandle:
    """The lower tier's backend on ``ns``, bypassing the chain (to damage a block)."""
    tier = load_config(config).tiers[1]
    handle = default_registry().create(tier.backend)
    handle.open(tier.options, ns.hex)
    return handle


def flip_last_byte(blob: bytes) -> bytes:
    return blob[:-1] + bytes([blob[-1] ^ 0x01])


def test_inspect_scrub_purge(tmp_path: Path, store: dict[str, Any]) -> None:
    config = write_config(tmp_path, store)
    codec = store.get("codec", "none")
    fill(config)
    sizes = {ns.hex: {k: stored_size(ns, k, p, codec) for k, p in payloads(ns).items()}
             for ns in (LLAMA, QWEN)}

    # inspect: both namespaces, described, with exact block counts, bytes and codecs
    result = run("inspect", config, "--json")
    assert result.exit_code == 0, result.output
    report = as_json(result)
    assert [t["tier"] for t in report["tiers"]] == ["ram", "disk"]
    assert "memory of the process" in report["tiers"][0]["skipped"]
    held = {ns["namespace"]: ns for ns in disk(report)["namespaces"]}
    assert set(held) == {LLAMA.hex, QWEN.hex} and CATALOG_HEX not in held
    assert disk(report)["descriptors"] == 2
    for ns in (LLAMA, QWEN):
        row = held[ns.hex]
        assert row["description"]["model"] == ns.model
        assert row["description"]["dtype"] == ns.dtype
        assert row["description"]["tokens_per_block"] == ns.tokens_per_block
        assert row["description"]["kv_layout"] == ns.kv_layout
        assert (row["blocks"], row["bytes"]) == (N, sum(sizes[ns.hex].values()))
        assert row["codecs"] == {codec: N} and row["sampled"] == N
        if store["backend"] == "redis":
            assert row["oldest"] is None and row["newest"] is None  # Redis keeps no times
        else:
            assert time.time() - 600 < row["oldest"] <= row["newest"] <= time.time() + 60
    table = run("inspect", config, "--tier", "disk")
    assert table.exit_code == 0 and "llama-test" in table.stdout and "qwen-test" in table.stdout
    assert LLAMA.hex[:12] in table.stdout and "float16, 16" in table.stdout

    # scrub: a clean store passes; one flipped byte is found, reported, then removed
    clean = run("scrub", config, "--json")
    assert clean.exit_code == 0, clean.output
    assert disk(as_json(clean))["checked"] == 2 * N + 2  # the descriptors are checked too
    bad_key = list(payloads(LLAMA))[5]
    raw = open_raw(config, LLAMA)
    try:
        assert raw.tamper(bad_key, flip_last_byte)
    finally:
        raw.close()
    found = run("scrub", config, "--json")
    assert found.exit_code == 1, found.output
    (corrupt,) = disk(as_json(found))["corrupt"]
    assert (corrupt["namespace"], corrupt["key"], corrupt["removed"]) == (
        LLAMA.hex, bad_key.hex(), False)
    assert "checksum" in corrupt["reason"] or "zstd" in corrupt["reason"]
    readable = run("scrub", config)
    assert readable.exit_code == 1 and bad_key.hex() in readable.stdout
    assert "--repair" in readable.stdout
    repaired = run("scrub", config, "--repair", "--json")
    assert repaired.exit_code == 1
    assert [c["removed"] for c in disk(as_json(repaired))["corrupt"]] == [True]
    again = run("scrub", config, "--json", "--max-rate", "100MiB")
    assert again.exit_code == 0, again.output
    assert disk(as_json(again))["checked"] == 2 * N + 1
    assert read_back(config, LLAMA) == {k: None if k == bad_key else v
                                        for k, v in payloads(LLAMA).items()}

    # purge: asks first; a refusal deletes nothing; --yes deletes exactly one model
    refused = run("purge", config, "--model", "qwen-test", stdin="n\n")
    assert refused.exit_code == 1
    assert disk(as_json(run("inspect", config, "--json")))["descriptors"] == 2
    purged = run("purge", config, "--model", "qwen-test", "--yes", "--json")
    assert purged.exit_code == 0, purged.output
    done = as_json(purged)
    assert done["removed_blocks"] == N
    assert done["freed_bytes"] == sum(sizes[QWEN.hex].values())
    after = disk(as_json(run("inspect", config, "--json")))
    assert [ns["namespace"] for ns in after["namespaces"]] == [LLAMA.hex]
    assert after["namespaces"][0]["blocks"] == N - 1 and after["descriptors"] == 1
    assert read_back(config, QWEN) == dict.fromkeys(payloads(QWEN))
    assert read_back(config, LLAMA) == {k: None if k == bad_key else v
                                        for k, v in payloads(LLAMA).items()}

    if store["backend"] == "redis":
        undated = run("purge", config, "--older-than", "7d", "--yes", "--json")
        assert undated.exit_code == 0
        assert disk(as_json(undated))["undated"] == N - 1
        assert as_json(undated)["removed_blocks"] == 0


def test_purge_by_age_and_namespace(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"name": "disk", "backend": "fs",
                                     "url": f"file://{tmp_path}/kv"})
    fill(config)
    old = list(payloads(LLAMA))[:3]
    week_and_a_day = time.time() - 8 * 86400
    for key in old:
        hexkey = key.hex()
        path = tmp_path / "kv" / LLAMA.hex / hexkey[:2] / hexkey[2:4] / f"{hexkey}.kvb"
        os.utime(path, (week_and_a_day, week_and_a_day))
    aged = run("purge", config, "--older-than", "7d", "--yes", "--json")
    assert aged.exit_code == 0, aged.output
    assert as_json(aged)["removed_blocks"] == 3
    back = read_back(config, LLAMA)
    assert [k for k, v in back.items() if v is None] == old
    by_ns = run("purge", config, "--namespace", QWEN.hex, "--yes")
    assert by_ns.exit_code == 0 and "removed 12 block(s)" in by_ns.stdout
    assert read_back(config, QWEN) == dict.fromkeys(payloads(QWEN))
    assert read_back(config, LLAMA) == {k: (None if k in old else v)
                                        for k, v in payloads(LLAMA).items()}


def test_refusals(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"name": "disk", "backend": "fs",
                                     "url": f"file://{tmp_path}/kv"})
    nothing = run("purge", config, "--yes")
    assert nothing.exit_code == 2 and "needs a selector" in nothing.stderr
    assert run("purge", config, "--namespace", "xyz", "--yes").exit_code == 2
    unknown = run("inspect", config, "--tier", "nosuch")
    assert unknown.exit_code == 2 and "no tier named 'nosuch'" in unknown.stderr
    assert run("scrub", config, "--max-rate", "fast").exit_code == 2


def test_a_tier_without_scan_is_skipped_or_refused(tmp_path: Path) -> None:
    (tmp_path / "kv").mkdir()  # the commands create no store (test_operate_missing_root.py)
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump({"chain": [
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/kv"},
        {"name": "peers", "backend": "peer", "peers": ["127.0.0.1:9"],
         "connect_timeout": "200ms"}]}))
    listing = run("inspect", str(path), "--json")
    assert listing.exit_code == 0, listing.output
    peers = [t for t in as_json(listing)["tiers"] if t["tier"] == "peers"]
    assert "does not implement kvtier_scan (contract 1.1)" in peers[0]["skipped"]
    named = run("scrub", str(path), "--tier", "peers")
    assert named.exit_code == 2 and "kvtier_scan" in named.stderr


def test_rate_limit_sleeps_off_what_runs_ahead() -> None:
    slept: list[float] = []
    limit = RateLimit(1000.0, slept.append)
    limit.spent(500)  # half a second of budget used at once
    assert len(slept) == 1 and 0.3 < slept[0] <= 0.5
    RateLimit(None, slept.append).spent(10**9)
    assert len(slept) == 1, "no limit never sleeps"
