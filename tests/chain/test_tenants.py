"""Tenants in a block's identity, and encryption at rest, on real host and fs tiers.

Every claim is read back from the tier or from the files on disk, byte for
byte: a tenant's keys never name another tenant's block, a block copied
between tenants or keys is a miss counted as corrupt, a stolen fs root holds
no payload byte in the clear, and blocks written before and after a key
rotation both read back exact.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import warnings
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kvtier.block import framing
from kvtier.block.namespace import DEFAULT_TENANT, Namespace
from kvtier.chain.chain import Chain, open_chain
from kvtier.chain.tenants import open_tenants
from kvtier.spec import ConfigError

pytest.importorskip("cryptography")

MODEL = {"model": "tenant-test", "dtype": "bfloat16", "tokens_per_block": 16}
SIZE = 64 << 10
KEYS = [bytes([i]) * 16 for i in range(1, 9)]


def payload(seed: int, size: int = SIZE) -> bytes:
    return random.Random(seed).randbytes(size)


def fs_tier(root: Path, **over: Any) -> dict[str, Any]:
    return {"name": "disk", "backend": "fs", "url": str(root), "fsync": False, **over}


def block_files(root: Path, ns: str) -> dict[bytes, Path]:
    out = {}
    for folder, _, names in os.walk(root / ns):
        for name in names:
            if name.endswith(".kvb"):
                out[bytes.fromhex(name[:-4])] = Path(folder) / name
    return out


def header_fields(blob: bytes) -> list[Any]:
    length = int.from_bytes(blob[4:6], "little")
    fields: list[Any] = msgpack.unpackb(blob[6 : 6 + length], raw=True)
    return fields


def get(chain: Chain, keys: list[bytes], size: int = SIZE) -> list[bytes | None]:
    outs = [bytearray(size) for _ in keys]
    found = chain.get(keys, outs)
    return [bytes(o) if f else None for o, f in zip(outs, found)]


def corrupt(chain: Chain) -> int:
    return sum(t["corrupt"] for t in chain.stats()["tiers"])


@pytest.fixture
def master_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Three master keys: two in files, one in the environment (its source strings)."""
    sources = []
    for i in range(2):
        path = tmp_path / f"key{i}"
        path.write_text(secrets.token_hex(32) + "\n")
        sources.append(f"file:{path}")
    monkeypatch.setenv("KVTIER_TEST_MASTER", secrets.token_hex(32))
    sources.append("env:KVTIER_TEST_MASTER")
    return sources


# identity ----------------------------------------------------------------------
def test_a_tenant_is_part_of_the_namespace() -> None:
    base = Namespace.of(MODEL)
    assert base.tenant == DEFAULT_TENANT
    acme, other = base.for_tenant("acme"), base.for_tenant("other")
    assert len({base.fingerprint, acme.fingerprint, other.fingerprint}) == 3
    assert base.for_tenant(None) == base
    assert base.for_tenant("public", shared={"public"}).fingerprint == base.fingerprint
    assert Namespace.of({**MODEL, "tenant": "acme"}).fingerprint == acme.fingerprint
    for bad in ("", "a b", "-x", "x" * 65, "ü"):
        with pytest.raises(ValueError, match="tenant"):
            base.for_tenant(bad)


@pytest.mark.parametrize("tiers", ["host", "fs", "host+fs"])
def test_keys_of_two_tenants_never_name_the_same_block(tmp_path: Path, tiers: str) -> None:
    chain_tiers = []
    if "host" in tiers:
        chain_tiers.append({"name": "ram", "backend": "host", "capacity": "64MiB"})
    if "fs" in tiers:
        chain_tiers.append(fs_tier(tmp_path / "root"))
    with open_tenants({"chain": chain_tiers}, MODEL) as tenants:
        acme, beta = tenants.chain("acme"), tenants.chain("beta")
        assert all(acme.put(KEYS, [payload(i) for i in range(len(KEYS))]))
        assert all(beta.put(KEYS[:4], [payload(100 + i) for i in range(4)]))
        acme.flush(), beta.flush()
        # the same keys, each tenant its own bytes; beta never wrote the last four
        assert get(acme, KEYS) == [payload(i) for i in range(len(KEYS))]
        assert get(beta, KEYS) == [payload(100 + i) for i in range(4)] + [None] * 4
        assert get(tenants.chain(None), KEYS) == [None] * len(KEYS)
        assert corrupt(acme) == corrupt(beta) == 0
        if "fs" in tiers:
            root = tmp_path / "root"
            for chain, tenant, n in ((acme, b"acme", 8), (beta, b"beta", 4)):
                files = block_files(root, chain.namespace.hex)
                assert sorted(files) == sorted(KEYS[:n])
                for key, path in files.items():
                    fields = header_fields(path.read_bytes())
                    assert fields[1] == chain.namespace.fingerprint and fields[2] == key
                    assert fields[8] == tenant  # a rebuilt index knows whose block it is


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_block_copied_to_another_tenant_is_a_corrupt_miss(
    tmp_path: Path, master_keys: list[str], encrypt: bool
) -> None:
    root = tmp_path / "root"
    tier = fs_tier(root, **({"encrypt": master_keys[0]} if encrypt else {}))
    with open_tenants({"chain": [tier]}, MODEL) as tenants:
        acme, beta = tenants.chain("acme"), tenants.chain("beta")
        assert acme.put(KEYS[:1], [payload(1)]) == [True]
        src = block_files(root, acme.namespace.hex)[KEYS[0]]
        dst = root / beta.namespace.hex / src.relative_to(root / acme.namespace.hex)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        # fs indexes at open: a fresh chain of beta finds the copied file
    with open_tenants({"chain": [tier]}, MODEL) as tenants:
        beta = tenants.chain("beta")
        assert beta.lookup(KEYS[:1]) == [0]
        assert get(beta, KEYS[:1]) == [None]
        assert corrupt(beta) == 1
        assert get(tenants.chain("acme"), KEYS[:1]) == [payload(1)]


# encryption at rest ------------------------------------------------------------
def _scan_for(root: Path, needles: list[bytes]) -> list[str]:
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            data = (Path(folder) / name).read_bytes()
            found += [f"{name}@{data.find(n)}" for n in needles if n in data]
    return found


@pytest.mark.parametrize("codec", ["none", "zstd:shuffle=0"])
def test_stolen_disk_holds_no_payload_bytes(
    tmp_path: Path, master_keys: list[str], codec: str
) -> None:
    payloads = [payload(i, 2 << 20) for i in range(4)]
    # 32-byte windows from the start, middle and end of every payload
    needles = [p[o : o + 32] for p in payloads for o in (0, len(p) // 2, len(p) - 32)]
    for encrypt, root in ((False, tmp_path / "plain"), (True, tmp_path / "sealed")):
        tier = fs_tier(root, codec=codec, **({"encrypt": master_keys[2]} if encrypt else {}))
        with open_tenants({"chain": [tier]}, MODEL) as tenants:
            chain = tenants.chain("acme")
            assert all(chain.put(KEYS[:4], payloads))
            assert get(chain, KEYS[:4], 2 << 20) == payloads
        found = _scan_for(root, needles)
        if encrypt:
            assert found == [], f"plaintext found on an encrypted root: {found[:5]}"
        else:  # the scan finds what is there: every needle in the plaintext root
            assert len(found) == len(needles)
    with open_tenants({"chain": [fs_tier(tmp_path / "sealed", encrypt=master_keys[2])]},
                      MODEL) as tenants:  # and a new process reads the blocks back
        assert get(tenants.chain("acme"), KEYS[:4], 2 << 20) == payloads


def test_rotation_keeps_old_blocks_readable_and_writes_under_the_new_key(
    tmp_path: Path, master_keys: list[str]
) -> None:
    root = tmp_path / "root"
    ns = Namespace.of(MODEL).for_tenant("acme")
    old, new = master_keys[0], master_keys[1]
    with open_chain({"chain": [fs_tier(root, encrypt=old)]}, ns) as chain:
        assert all(chain.put(KEYS[:4], [payload(i) for i in range(4)]))
        old_id = chain.tiers[0].seal.write_id  # type: ignore[union-attr]
    with open_chain({"chain": [fs_tier(root, encrypt=f"{new}, {old}")]}, ns) as chain:
        assert all(chain.put(KEYS[4:], [payload(i) for i in range(4, 8)]))
        new_id = chain.tiers[0].seal.write_id  # type: ignore[union-attr]
        assert get(chain, KEYS) == [payload(i) for i in range(8)]
        assert corrupt(chain) == 0
    assert old_id != new_id
    files = block_files(root, ns.hex)
    ids = {k: header_fields(files[k].read_bytes())[9] for k in KEYS}
    assert ids == {k: old_id if i < 4 else new_id for i, k in enumerate(KEYS)}
    # the old key dropped from the list: its blocks are misses, counted as corrupt
    with open_chain({"chain": [fs_tier(root, encrypt=new)]}, ns) as chain:
        assert get(chain, KEYS) == [None] * 4 + [payload(i) for i in range(4, 8)]
        assert corrupt(chain) == 4


def test_a_block_under_another_key_is_a_corrupt_miss(
    tmp_path: Path, master_keys: list[str]
) -> None:
    root = tmp_path / "root"
    ns = Namespace.of(MODEL).for_tenant("acme")
    with open_chain({"chain": [fs_tier(root, encrypt=master_keys[0])]}, ns) as chain:
        assert all(chain.put(KEYS[:2], [payload(1), payload(2)]))
    path = block_files(root, ns.hex)[KEYS[0]]
    blob = bytearray(path.read_bytes())
    # relabel the header's key id as the other key's: the tag no longer matches
    other = framing.parse_header(blob, ns.fingerprint, KEYS[0])
    with open_chain({"chain": [fs_tier(tmp_path / "x", encrypt=master_keys[1])]}, ns) as c2:
        new_id = c2.tiers[0].seal.write_id  # type: ignore[union-attr]
    at = bytes(blob).index(other.key_id)
    blob[at : at + len(new_id)] = new_id
    path.write_bytes(blob)
    with open_chain({"chain": [fs_tier(root, encrypt=f"{master_keys[1]}, {master_keys[0]}")]},
                    ns) as chain:
        assert get(chain, KEYS[:2]) == [None, payload(2)]
        assert corrupt(chain) == 1
    # never readable under a key that is not listed
    with open_chain({"chain": [fs_tier(root, encrypt=master_keys[1])]}, ns) as chain:
        assert get(chain, KEYS[1:2]) == [None]


@pytest.mark.parametrize("where", ["ciphertext", "tag", "nonce", "tenant"])
def test_a_damaged_sealed_block_is_a_corrupt_miss(
    tmp_path: Path, master_keys: list[str], where: str
) -> None:
    root = tmp_path / "root"
    ns = Namespace.of(MODEL).for_tenant("acme")
    tier = fs_tier(root, encrypt=master_keys[0])
    with open_chain({"chain": [tier]}, ns) as chain:
        assert all(chain.put(KEYS[:2], [payload(1), payload(2)]))
    path = block_files(root, ns.hex)[KEYS[0]]
    blob = bytearray(path.read_bytes())
    header = framing.parse_header(blob, ns.fingerprint, KEYS[0])
    at = {"ciphertext": header.size + 1000, "tag": len(blob) - 1,
          "nonce": bytes(blob).index(header.nonce) + 3,
          "tenant": bytes(blob).index(b"acme")}[where]
    blob[at] ^= 0x20  # "acme" -> "Acme": still a valid tenant name
    path.write_bytes(blob)
    with open_chain({"chain": [tier]}, ns) as chain:
        assert get(chain, KEYS[:2]) == [None, payload(2)]
        assert corrupt(chain) == 1


def test_an_inline_master_key_is_refused_naming_the_key(tmp_path: Path) -> None:
    tier = fs_tier(tmp_path / "root", encrypt=secrets.token_hex(32))
    with pytest.raises(ConfigError) as info:
        open_chain({"chain": [tier]}, MODEL)
    assert info.value.key == "chain[0].encrypt"
    assert "file:PATH or env:VAR" in str(info.value)
    tier = fs_tier(tmp_path / "root", encrypt="env:KVTIER_TEST_NO_SUCH_VARIABLE")
    with pytest.raises(ConfigError, match="KVTIER_TEST_NO_SUCH_VARIABLE"):
        open_chain({"chain": [tier]}, MODEL)


def test_host_above_an_encrypted_fs_tier_stays_plaintext_and_moves_blocks(
    tmp_path: Path, master_keys: list[str]
) -> None:
    """Demotion from a plaintext host tier into a sealed fs tier, and promotion back."""
    root = tmp_path / "root"
    ram = {"name": "ram", "backend": "host", "capacity": "256KiB"}
    cfg = {"chain": [ram, fs_tier(root, encrypt=master_keys[0], write="back")]}
    with open_tenants(cfg, MODEL) as tenants:
        chain = tenants.chain("acme")
        assert all(chain.put(KEYS, [payload(i) for i in range(len(KEYS))]))
        chain.flush()
        assert get(chain, KEYS) == [payload(i) for i in range(len(KEYS))]
        chain.flush()
        assert corrupt(chain) == 0
        assert chain.tiers[0].seal is None and chain.tiers[1].seal is not None
    files = block_files(root, Namespace.of(MODEL).for_tenant("acme").hex)
    assert files and all(header_fields(p.read_bytes())[9] for p in files.values())


def test_stolen_bucket_holds_no_payload_bytes_and_tenants_stay_apart(
    s3_server: Any, bucket: str, master_keys: list[str]
) -> None:
    """The object tier on a real SeaweedFS: every object in the bucket read back raw."""
    obstore = pytest.importorskip("obstore")
    from obstore.store import S3Store

    def object_tier(prefix: str, **over: Any) -> dict[str, Any]:
        return {"name": "bucket", "backend": "object", "bucket": bucket,
                "endpoint": s3_server.endpoint, "region": s3_server.region,
                "access_key_id": s3_server.access_key,
                "secret_access_key": s3_server.secret_key, "prefix": prefix, **over}

    store = S3Store(bucket, config={
        "endpoint": s3_server.endpoint, "region": s3_server.region,
        "access_key_id": s3_server.access_key, "secret_access_key": s3_server.secret_key,
    }, client_options={"allow_http": True})

    def objects(prefix: str) -> dict[str, bytes]:
        return {meta["path"]: bytes(obstore.get(store, meta["path"]).bytes())
                for chunk in obstore.list(store, prefix + "/") for meta in chunk}

    payloads = [payload(i, 1 << 20) for i in range(3)]
    needles = [p[o : o + 32] for p in payloads for o in (0, len(p) // 2, len(p) - 32)]
    for prefix, over in (("plain", {}), ("sealed", {"encrypt": master_keys[0]})):
        with open_tenants({"chain": [object_tier(prefix, **over)]}, MODEL) as tenants:
            acme, beta = tenants.chain("acme"), tenants.chain("beta")
            assert all(acme.put(KEYS[:3], payloads))
            assert all(beta.put(KEYS[:1], [payload(99, 1 << 20)]))
            assert get(acme, KEYS[:3], 1 << 20) == payloads
            assert get(beta, KEYS[:3], 1 << 20) == [payload(99, 1 << 20), None, None]
            held = objects(prefix)
            # each tenant's blocks under its own namespace's prefix
            for chain, n in ((acme, 3), (beta, 1)):
                mine = f"{prefix}/{chain.namespace.hex}/"
                assert len([p for p in held if p.startswith(mine)]) == n
        data = b"".join(held.values())
        found = [n for n in needles if n in data]
        assert found == ([] if over else needles)


def test_scrub_opens_sealed_blocks_and_never_removes_what_it_cannot_open(
    tmp_path: Path, master_keys: list[str]
) -> None:
    import json

    import yaml
    from click.testing import CliRunner

    from kvtier.cli import cli

    root = tmp_path / "root"

    def config(encrypt: str) -> str:
        path = tmp_path / f"chain-{len(encrypt)}.yaml"
        path.write_text(yaml.safe_dump({"chain": [fs_tier(root, encrypt=encrypt)]}))
        return str(path)

    def scrub(cfg: str, *more: str) -> tuple[int, dict[str, Any]]:
        result = CliRunner().invoke(cli, ["scrub", cfg, "--json", *more],
                                    catch_exceptions=False)
        (tier,) = json.loads(result.stdout)["tiers"]
        return result.exit_code, tier

    keyed = config(master_keys[0])
    with open_tenants(keyed, MODEL) as tenants:
        chain = tenants.chain("acme")
        assert all(chain.put(KEYS[:4], [payload(i) for i in range(4)]))
    assert scrub(keyed)[0] == 0
    ns = Namespace.of(MODEL).for_tenant("acme")
    path = block_files(root, ns.hex)[KEYS[2]]
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1  # the tag
    path.write_bytes(blob)
    code, tier = scrub(keyed)
    assert code == 1 and [c["key"] for c in tier["corrupt"]] == [KEYS[2].hex()]
    assert "authentication failed" in tier["corrupt"][0]["reason"]
    # without the keys a scrub checks headers only, and removes nothing
    code, tier = scrub(config("none"), "--repair")
    assert code == 0 and tier["corrupt"] == []
    assert sorted(block_files(root, ns.hex)) == sorted(KEYS[:4])


def test_two_tenants_on_one_redis_server_never_share_a_block(tmp_path: Path) -> None:
    """kvtier-redis keeps tenants apart as it keeps namespaces apart: no change needed."""
    pytest.importorskip("kvtier_redis")
    from redis_server import RedisServer

    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        tier = {"name": "redis", "backend": "redis", "url": server.url(3)}
        with open_tenants({"chain": [tier]}, MODEL) as tenants:
            acme, beta = tenants.chain("acme"), tenants.chain("beta")
            assert all(acme.put(KEYS[:3], [payload(i) for i in range(3)]))
            assert all(beta.put(KEYS[:1], [payload(50)]))
            assert get(acme, KEYS[:3]) == [payload(i) for i in range(3)]
            assert get(beta, KEYS[:3]) == [payload(50), None, None]
            assert corrupt(acme) == corrupt(beta) == 0
    finally:
        server.stop()


def test_sealed_frames_served_on_are_promoted_into_a_plaintext_tier(
    tmp_path: Path, master_keys: list[str]
) -> None:
    """get_blobs (what kvtier serve sends) promotes frames as read: a sealed one is
    opened with the keys of the tier it came from, and stored in plaintext above."""
    ram = {"name": "ram", "backend": "host", "capacity": "64MiB"}
    cfg = {"chain": [ram, fs_tier(tmp_path / "root", encrypt=master_keys[0])]}
    with open_tenants(cfg, MODEL) as tenants:
        chain = tenants.chain("acme")
        assert all(chain.put(KEYS[:3], [payload(i) for i in range(3)]))
        chain.flush()
        assert chain.tiers[0].evict(KEYS[:3]) == [True] * 3
        blobs = chain.get_blobs(KEYS[:3])
        assert all(b is not None and header_fields(bytes(b))[9] for b in blobs)
        chain.flush()
        assert chain.tiers[0].lookup(KEYS[:3]) == [True] * 3
        assert corrupt(chain) == 0
        held = chain.tiers[0].get_blobs(KEYS[:3])
        assert all(b is not None and not header_fields(bytes(b))[9] for b in held)
        assert get(chain, KEYS[:3]) == [payload(i) for i in range(3)]


def test_a_tenant_s_tiers_open_with_the_options_the_loader_checked(tmp_path: Path) -> None:
    # the tenant (and host's share) join options checked once by the loader: opening
    # checks them no second time, so a shared key's backend name warns of nothing
    config = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB",
                         "tenants": {"*": {"quota": "512KiB"}}},
                        fs_tier(tmp_path / "disk", concurrency=3,
                                tenants={"*": {"quota": "1MiB"}})]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with open_tenants(config, {"model": "m"}) as tenants:
            chain = tenants.chain("acme")
            assert chain.put([b"k"], [payload(1)]) == [True]
            assert chain.flush(30)
            out = bytearray(SIZE)
            assert chain.get([b"k"], [out]) == [True] and bytes(out) == payload(1)
        # the fs tier opened (it would start failed on a warning) and holds the block
        assert len(list((tmp_path / "disk").rglob(f"{b'k'.hex()}.kvb"))) == 1
