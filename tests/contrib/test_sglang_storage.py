"""kvtier under SGLang 0.5.23's HiCache, driven through SGLang's own code.

SGLang's ``StorageBackendFactory`` builds the backend from the documented
extra config; pages live in SGLang's own host KV pools (MHA and MLA, every
storage layout) built on the CPU; they move through the page get/set
methods of SGLang's ``HiCacheController`` (v0 copies, v1 zero-copy), keyed
by SGLang's own page hashes.  Tiers are real: host and fs in ``tmp_path``,
an object tier on a SeaweedFS server started here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import threading
from pathlib import Path

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang 0.5.23 is not installed (make venv installs it)", allow_module_level=True)

import torch
from click.testing import CliRunner
from seaweed import SeaweedServer
from sglang_host import import_host_pools, mha_pool, mla_pool

import kvtier
from kvtier.cli.main import cli
from kvtier.contrib.sglang import extra_config, sglang_args
from kvtier.contrib.sglang.keys import namespace_for, storage_key

import_host_pools()  # before SGLang's other modules: see tests/support/sglang_host.py
from sglang.srt.managers.cache_controller import HiCacheController, PrefetchOperation  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglang_pages import (  # noqa: E402
    PAGE,
    attach,
    controller,
    fill_random,
    host_fs,
    indices,
    load_v1,
    page_bytes,
    page_hashes,
    save_v1,
    storage_config,
    tier_stats,
    write_chain,
)

from kvtier.contrib.sglang.storage import KvtierStorage  # noqa: E402

LAYOUTS = ("layer_first", "page_first", "page_first_direct")
POOLS = {"mha": mha_pool, "mla": mla_pool}


# the factory and the flags ----------------------------------------------------------------
def test_factory_builds_the_backend_from_the_documented_config(tmp_path: Path) -> None:
    chain_yaml = host_fs(tmp_path)
    documented = {"backend_name": "kvtier", "module_path": "kvtier.contrib.sglang",
                  "class_name": "KvtierStorage", "kvtier_config": str(chain_yaml)}
    pool = mha_pool("page_first")
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(documented), pool)
    assert type(backend) is KvtierStorage and backend.interface == "v0"
    backend.register_mem_pool_host(pool)
    # SGLang's host pool is the RAM tier: the storage chain starts below it
    assert [t.name for t in backend.chain.tiers] == ["disk"]
    backend.close()
    kept = attach(chain_yaml, pool)
    assert [t.name for t in kept.chain.tiers] == ["ram", "disk"] and kept.interface == "v1"
    kept.close()

    printed = sglang_args(chain_yaml)
    flag = json.loads(printed[printed.index("--hicache-storage-backend-extra-config") + 1])
    assert flag == {**documented, "kvtier_config": os.path.abspath(chain_yaml), "interface_v1": 1}
    assert printed[printed.index("--hicache-storage-backend") + 1] == "dynamic"
    assert printed[printed.index("--hicache-size") + 1] == "1"  # 64 MiB: at least 1 GB


def test_a_bad_config_fails_at_start_up_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("chain:\n  - name: ram\n    backend: host\n    capacity: lots\n")
    extra = {"backend_name": "kvtier", "module_path": "kvtier.contrib.sglang",
             "class_name": "KvtierStorage", "kvtier_config": str(bad)}
    with pytest.raises(kvtier.ConfigError, match=r"bad\.yaml:4"):
        StorageBackendFactory.create_backend("dynamic", storage_config(extra), None)
    del extra["kvtier_config"]
    with pytest.raises(kvtier.ConfigError, match="kvtier_config"):
        StorageBackendFactory.create_backend("dynamic", storage_config(extra), None)
    only_ram = write_chain(tmp_path / "ram.yaml", [
        {"name": "ram", "backend": "host", "capacity": "64MiB"}])
    extra["kvtier_config"] = str(only_ram)
    with pytest.raises(kvtier.ConfigError, match="only a host tier"):
        StorageBackendFactory.create_backend("dynamic", storage_config(extra), None)


def test_sglang_args_command(tmp_path: Path) -> None:
    chain_yaml = host_fs(tmp_path)
    result = CliRunner().invoke(cli, ["sglang-args", str(chain_yaml)])
    assert result.exit_code == 0, result.output
    assert "--hicache-storage-backend dynamic" in result.output
    assert '"interface_v1":1' in result.output and "--hicache-size 1" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("chain:\n  - name: x\n    backend: nosuch\n")
    result = CliRunner().invoke(cli, ["sglang-args", str(bad)])
    assert result.exit_code == 2 and "nosuch" in result.output


# round trips ------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", sorted(POOLS))
def test_v1_pages_round_trip_byte_for_byte(tmp_path: Path, kind: str, layout: str) -> None:
    chain_yaml = host_fs(tmp_path)
    pool = POOLS[kind](layout)
    fill_random(pool, seed=1)
    keys = page_hashes(6)
    written = page_bytes(pool, 1, 6)
    backend = attach(chain_yaml, pool)
    assert save_v1(backend, pool, keys, first_page=1)
    backend.close()  # writes reach the fs tier

    fresh = POOLS[kind](layout)  # another process: empty RAM tier, reads come from disk
    fresh.kv_buffer.zero_()
    reader = attach(chain_yaml, fresh)
    assert reader.batch_exists(keys) == 6
    assert load_v1(reader, fresh, keys, first_page=9) == 6
    assert page_bytes(fresh, 9, 6) == written
    assert tier_stats(reader, "disk")["hits"] == 6 * reader._regions
    untouched = page_bytes(fresh, 1, 6)
    assert all(page == bytes(len(page)) for page in untouched)  # nothing written elsewhere
    reader.close()


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
@pytest.mark.parametrize("kind", sorted(POOLS))
def test_v0_pages_round_trip_byte_for_byte(tmp_path: Path, kind: str, layout: str) -> None:
    chain_yaml = host_fs(tmp_path)
    pool = POOLS[kind](layout)
    fill_random(pool, seed=2)
    keys = page_hashes(5, seed=2)
    backend = attach(chain_yaml, pool, v1=False)
    assert HiCacheController._generic_page_set(controller(backend, pool), keys, indices(0, 5))
    backend.close()

    fresh = POOLS[kind](layout)
    reader = attach(chain_yaml, fresh, v1=False)
    op = PrefetchOperation("req", list(range(5 * PAGE)))
    loaded = HiCacheController._generic_page_get(controller(reader, fresh), op, keys,
                                                 indices(3, 5))
    assert loaded == 5
    assert page_bytes(fresh, 3, 5) == page_bytes(pool, 0, 5)
    assert reader.exists(keys[0]) and not reader.exists(page_hashes(1, seed=99)[0])
    one = reader.get(keys[1], fresh.get_dummy_flat_data_page())
    assert bytes(one.view(torch.uint8).numpy()) == bytes(
        pool.get_data_page(PAGE).contiguous().view(torch.uint8).numpy())
    assert reader.get(page_hashes(1, seed=99)[0], fresh.get_dummy_flat_data_page()) is None
    reader.close()


def test_partial_hits_give_the_stored_prefix(tmp_path: Path) -> None:
    chain_yaml = host_fs(tmp_path)
    pool = mha_pool("page_first")
    fill_random(pool, seed=3)
    keys = page_hashes(8, seed=3)
    backend = attach(chain_yaml, pool)
    assert save_v1(backend, pool, keys[:5], first_page=0)
    assert backend.batch_exists(keys) == 5
    assert load_v1(backend, pool, keys, first_page=10) == 5  # SGLang stops at the first miss
    assert page_bytes(pool, 10, 5) == page_bytes(pool, 0, 5)
    # one region (V of page 2) gone: the page no longer counts, nor do the ones after it
    assert backend.chain.evict([storage_key(keys[2], 2)]) == 1
    assert backend.batch_exists(keys) == 2
    assert backend.batch_get_v1(keys[:5], indices(20, 5)) == [True, True, False, True, True]
    assert backend.batch_exists([]) == 0 and backend.batch_get_v1([], indices(0, 0)) == []
    backend.close()


# faults -----------------------------------------------------------------------------------
def test_a_corrupt_block_is_a_counted_miss(tmp_path: Path) -> None:
    chain_yaml = write_chain(tmp_path / "tiers.yaml", [
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "fs")}])
    pool = mla_pool("page_first")  # one region per page: one file per page
    fill_random(pool, seed=4)
    keys = page_hashes(4, seed=4)
    backend = attach(chain_yaml, pool)
    assert save_v1(backend, pool, keys, first_page=0)
    # the pages' blocks: beside them are the tier's index and the catalog's namespace record
    files = sorted(p for p in (tmp_path / "fs" / backend.chain.namespace.hex).rglob("*.kvb"))
    assert len(files) == 4
    victim = max(files, key=lambda p: p.stat().st_mtime_ns)  # any one of them
    data = bytearray(victim.read_bytes())
    data[-7] ^= 0x5A  # a payload byte
    victim.write_bytes(bytes(data))

    got = backend.batch_get_v1(keys, indices(8, 4))
    assert got.count(False) == 1
    stats = tier_stats(backend, "disk")
    assert stats["corrupt"] == 1
    expected = page_bytes(pool, 0, 4)
    for page, hit in enumerate(got):
        if hit:
            assert page_bytes(pool, 8 + page, 1)[0] == expected[page]
    backend.close()


def test_object_tier_killed_mid_run_gives_misses_not_errors(tmp_path: Path) -> None:
    server = SeaweedServer(tmp_path / "weed")  # private: this test kills it
    server.start()
    try:
        bucket = server.make_bucket("kvt-sglang")
        chain_yaml = write_chain(tmp_path / "tiers.yaml", [
            {"name": "ram", "backend": "host", "capacity": "64MiB"},
            {"name": "obj", "backend": "object", "bucket": bucket, "endpoint": server.endpoint,
             "access_key_id": server.access_key, "secret_access_key": server.secret_key,
             "region": server.region, "lookup_cache_ttl": 0, "request_timeout": "2s",
             "connect_timeout": "1s"},
        ])
        pool = mha_pool("page_first")
        fill_random(pool, seed=5)
        keys = page_hashes(4, seed=5)
        writer = attach(chain_yaml, pool)
        assert save_v1(writer, pool, keys, first_page=0)
        writer.close()

        reader = attach(chain_yaml, mha_pool("page_first"))
        assert reader.batch_exists(keys[:1]) == 1  # served by SeaweedFS
        server.kill()
        assert reader.batch_exists(keys) == 0
        assert reader.batch_get_v1(keys, indices(8, 4)) == [False] * 4
        assert load_v1(reader, reader.mem_pool_host, keys, first_page=8) == 0
        assert reader.get(keys[0], reader.mem_pool_host.get_dummy_flat_data_page()) is None
        # writes still land in the RAM tier, and read back from it
        assert save_v1(reader, pool, keys, first_page=0)
        assert load_v1(reader, reader.mem_pool_host, keys, first_page=8) == 4
        assert tier_stats(reader, "obj")["errors"] > 0
        reader.close()
    finally:
        server.kill()


def test_fs_tier_removed_mid_run_gives_misses(tmp_path: Path) -> None:
    chain_yaml = write_chain(tmp_path / "tiers.yaml", [
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "fs")}])
    pool = mha_pool("layer_first")
    fill_random(pool, seed=6)
    keys = page_hashes(3, seed=6)
    backend = attach(chain_yaml, pool)
    assert save_v1(backend, pool, keys, first_page=0)
    shutil.rmtree(tmp_path / "fs")
    # the fs tier answers lookups from its index; the reads find the files gone ...
    assert backend.batch_get_v1(keys, indices(4, 3)) == [False] * 3
    assert load_v1(backend, pool, keys, first_page=4) == 0
    # ... and the index forgets them
    assert backend.batch_exists(keys) == 0
    assert backend.faults == 0  # misses, not faults: the tier handled it
    backend.close()


def test_calls_before_registration_or_after_close_are_misses(tmp_path: Path) -> None:
    extra = extra_config(host_fs(tmp_path), keep_host_tier=True)
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(extra), None)
    key = page_hashes(1)[0]
    assert backend.batch_exists([key]) == 0
    assert backend.get(key, torch.zeros(8)) is None
    assert backend.set(key, torch.zeros(8)) is False
    assert backend.batch_get_v1([key], indices(0, 1)) == [False]
    assert backend.faults == 4


# concurrency ------------------------------------------------------------------------------
def test_threads_share_one_backend(tmp_path: Path) -> None:
    chain_yaml = host_fs(tmp_path)
    pool = mha_pool("page_first", device_tokens=128)  # 65 pages
    fill_random(pool, seed=7)
    backend = attach(chain_yaml, pool)
    errors: list[BaseException] = []
    threads_n, pages = 4, 4

    def worker(t: int) -> None:
        try:
            keys = page_hashes(pages, seed=100 + t)
            src, dst = t * pages, 32 + t * pages
            for _ in range(5):
                assert save_v1(backend, pool, keys, first_page=src)
                assert backend.batch_exists(keys) == pages
                assert load_v1(backend, pool, keys, first_page=dst) == pages
                assert page_bytes(pool, dst, pages) == page_bytes(pool, src, pages)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert backend.faults == 0
    backend.close()


# keys -------------------------------------------------------------------------------------
def test_keys_fit_and_never_collide() -> None:
    sha = page_hashes(1)[0]
    assert len(sha) == 64 and len(storage_key(sha)) == 35
    long = "x" * 200
    assert len(storage_key(long)) == 35 and storage_key(long) != storage_key("x" * 201)
    forms = {storage_key(k, r) for k in (sha, sha.upper(), "41", "A", long) for r in (0, 1, 2)}
    assert len(forms) == 15
    assert all(len(k) <= kvtier.spec.MAX_KEY_SIZE for k in forms)


def test_namespace_follows_rank_dtype_layout_and_model() -> None:
    mha = mha_pool("page_first")
    base = namespace_for(storage_config({}), mha, "v1")
    other_rank = namespace_for(storage_config({}, tp_rank=1, tp_size=2), mha, "v1")
    assert base.fingerprint != other_rank.fingerprint
    assert "tp2-rank1" in other_rank.parallel_layout
    assert base.fingerprint != namespace_for(storage_config({}), mha_pool("layer_first"),
                                             "v1").fingerprint
    assert base.fingerprint != namespace_for(storage_config({}), mha, "v0").fingerprint
    fp32 = mha_pool("page_first", dtype=torch.float32)
    assert base.fingerprint != namespace_for(storage_config({}), fp32, "v1").fingerprint
    assert base.fingerprint != namespace_for(storage_config({}, model_name="org/other"), mha,
                                             "v1").fingerprint
    mla = mla_pool("page_first")
    rank0 = namespace_for(storage_config({}, mla=True, tp_size=2), mla, "v1")
    rank1 = namespace_for(storage_config({}, mla=True, tp_rank=1, tp_size=2), mla, "v1")
    assert rank0.fingerprint == rank1.fingerprint  # MLA KV is the same on every TP rank
    assert base.tokens_per_block == PAGE and base.dtype == "bfloat16"


def test_readme_example_prints_what_the_readme_shows(tmp_path: Path) -> None:
    readme = (Path(__file__).parents[2] / "contrib" / "sglang" / "README.md").read_text()
    (example,) = re.findall(r"```yaml\n(.*?)```", readme, flags=re.S)
    chain_yaml = tmp_path / "tiers.yaml"
    chain_yaml.write_text(example)
    (shown,) = [line for line in readme.splitlines() if line.startswith("--enable-hierarchical")]
    result = CliRunner().invoke(cli, ["sglang-args", str(chain_yaml)])
    assert result.exit_code == 0, result.output
    printed = result.output.splitlines()[1].replace(os.path.abspath(chain_yaml), "/abs/tiers.yaml")
    assert shlex.split(printed) == shlex.split(shown)
