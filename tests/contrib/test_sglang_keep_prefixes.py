"""SGLang's ``keep_prefixes``: a named prefix's pages found by SGLang's own hashes, kept
in the engine tenant's chain through a flood.

The backend comes from SGLang's storage factory, pages live in SGLang's own
host pool and move through its ``HiCacheController`` page paths (v1 zero-copy);
the page keys are those SGLang's radix tree gives a node (``compute_node_hash_values``,
what its backup writes under) and its prefetch asks for (``_storage_hit_query``),
with a LoRA extra key and a cache salt.  The tier is a real ``fs`` pool with
room for a few pages and a keep budget.
"""

from __future__ import annotations

import importlib.util
import json
from array import array
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang 0.5.23 is not installed (make venv installs it)", allow_module_level=True)

from sglang_host import import_host_pools, mha_pool

import_host_pools()  # before SGLang's other modules: see tests/support/sglang_host.py
from sglang.srt.managers.cache_controller import HiCacheController, PrefetchOperation  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey, TreeNode  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import compute_node_hash_values  # noqa: E402
from sglang_pages import (  # noqa: E402
    PAGE,
    controller,
    fill_random,
    load_v1,
    page_bytes,
    page_hashes,
    save_v1,
    storage_config,
    write_chain,
)

from kvtier.contrib.sglang import extra_config  # noqa: E402
from kvtier.contrib.sglang.keep import KeepPrefix, parse_keep_prefixes  # noqa: E402
from kvtier.contrib.sglang.storage import KvtierStorage  # noqa: E402
from kvtier.spec import ConfigError  # noqa: E402

PREFIX = list(range(1000, 1014))  # three full pages of 4 tokens, and 2 tokens more
PROMPT = PREFIX + list(range(50, 60))  # the prefix, then 10 tokens: 6 pages in all
LORA, SALT = "lora-7", "salt-acme"


def tree_hashes(tokens: list[int], extra_key: str | None, salt: str | None) -> list[str]:
    """The page keys SGLang's radix tree gives a node of ``tokens`` under the root: what
    its backup stores pages under."""
    root = TreeNode()
    root.key, root.hash_value = RadixKey(array("q"), None), []
    node = TreeNode()
    node.parent = root
    node.key = RadixKey(array("q", tokens), extra_key=extra_key, cache_salt=salt)
    return compute_node_hash_values(node, PAGE)


def prefetch_hashes(backend: KvtierStorage, pool: Any, tokens: list[int]) -> list[str]:
    """The page keys SGLang's prefetch asks the storage for (its storage hit query)."""
    op = PrefetchOperation("req", RadixKey(array("q", tokens), extra_key=LORA, cache_salt=SALT))
    HiCacheController._storage_hit_query(controller(backend, pool), op)
    return list(op.all_hash_values)


def engine(tmp_path: Path, prefix_tenant: str | None, engine_tenant: str = "acme",
           name: str = "tiers.yaml") -> tuple[KvtierStorage, Any]:
    """An engine of ``engine_tenant`` on an fs pool with room for about 24 blocks (12
    pages), its tenant keeping 8 of them, whose extra config names the prefix in a file."""
    block = 8192 + 4096  # a block's file: an 8 KiB region, its header, some slack
    chain_yaml = write_chain(tmp_path / name, [{
        "name": "disk", "backend": "fs", "url": str(tmp_path / "fs"), "capacity": 24 * block,
        "direct_io": False, "tenants": {"*": {"keep": 8 * block}}}])
    ids = tmp_path / "support-bot.json"
    ids.write_text(json.dumps(PREFIX))
    entry: dict[str, Any] = {"name": "support-bot", "token_ids_file": str(ids),
                             "extra_key": LORA, "cache_salt": SALT}
    if prefix_tenant is not None:
        entry["tenant"] = prefix_tenant
    extra = {**extra_config(chain_yaml, tenant=engine_tenant), "keep_prefixes": [entry]}
    # page_first: two 8 KiB regions a page (K and V of its 4 tokens in every layer)
    pool = mha_pool("page_first", layers=4, heads=4, head_dim=64)
    backend = StorageBackendFactory.create_backend(
        "dynamic", storage_config(extra, is_page_first_layout=True), pool)
    backend.register_mem_pool_host(pool)
    assert isinstance(backend, KvtierStorage)
    return backend, pool


def flood(backend: KvtierStorage, pool: Any) -> None:
    """40 pages of other prompts, 4 at a time, from the pool's pages 8 to 11."""
    for batch in range(10):
        assert save_v1(backend, pool, page_hashes(4, seed=10 + batch), 8)


def test_the_prefix_pages_are_the_engine_s_page_keys(tmp_path: Path) -> None:
    backend, pool = engine(tmp_path, "acme")
    try:
        stored = tree_hashes(PROMPT, LORA, SALT)
        asked = prefetch_hashes(backend, pool, PROMPT)
        assert stored == asked and len(stored) == 6
        assert backend._keeper is not None and backend._keeper.hashes == set(stored[:3])
        # what else SGLang hashes in: another extra key, another salt or none, another token
        for other in (tree_hashes(PROMPT, None, SALT), tree_hashes(PROMPT, LORA, None),
                      tree_hashes(PROMPT, LORA, "salt-globex"),
                      tree_hashes([1001, *PROMPT[1:]], LORA, SALT)):
            assert not backend._keeper.hashes & set(other)
    finally:
        backend.close()


def test_the_prefix_pages_survive_a_flood_and_the_rest_go(tmp_path: Path) -> None:
    backend, pool = engine(tmp_path, None)  # the engine's tenant: acme
    try:
        fill_random(pool, seed=3)
        want = page_bytes(pool, 0, 6)
        keys = tree_hashes(PROMPT, LORA, SALT)
        assert save_v1(backend, pool, keys, 0)
        flood(backend, pool)
        pool.kv_buffer.zero_()  # what is loaded into the pool comes from the disk
        for i, key in enumerate(keys):  # page by page: a miss stops SGLang's load
            got = load_v1(backend, pool, [key], i)
            assert got == (1 if i < 3 else 0), i
        assert page_bytes(pool, 0, 3) == want[:3]  # byte for byte
        disk = next(t for t in backend.chain_stats()["tiers"] if t["name"] == "disk")
        assert disk["evictions"] > 0 and disk["keep_refused"] == 0
    finally:
        backend.close()


def test_a_prefix_loaded_from_an_earlier_run_is_kept(tmp_path: Path) -> None:
    first, pool = engine(tmp_path, "globex", name="first.yaml")  # stored, not kept
    fill_random(pool, seed=4)
    keys = tree_hashes(PROMPT, LORA, SALT)
    assert save_v1(first, pool, keys, 0)
    first.close()
    backend, pool = engine(tmp_path, "acme")
    try:
        assert load_v1(backend, pool, keys[:4], 0) == 4  # loaded: its three prefix pages kept
        flood(backend, pool)
        assert load_v1(backend, pool, keys[:3], 0) == 3
        assert load_v1(backend, pool, keys[3:4], 3) == 0
    finally:
        backend.close()


def test_a_prefix_named_for_another_tenant_keeps_nothing(tmp_path: Path) -> None:
    backend, pool = engine(tmp_path, "globex")  # the engine's tenant is acme
    try:
        assert backend._keeper is not None and not backend._keeper.hashes
        fill_random(pool, seed=5)
        keys = tree_hashes(PROMPT, LORA, SALT)
        assert save_v1(backend, pool, keys, 0)
        flood(backend, pool)
        assert load_v1(backend, pool, keys[:1], 0) == 0
    finally:
        backend.close()


def test_entries_read_token_ids_inline_or_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps([1, 2, 3]))
    assert parse_keep_prefixes([
        {"token_ids": [5, 6], "cache_salt": ""},
        {"name": "system", "tenant": "acme", "token_ids_file": str(path), "extra_key": "x",
         "cache_salt": "s"},
    ]) == (KeepPrefix("prefix-0", None, (5, 6)),
           KeepPrefix("system", "acme", (1, 2, 3), "x", "s"))


@pytest.mark.parametrize(("value", "reason"), [
    ({"token_ids": [1]}, "expected a list"),
    ([{"token_ids": [1], "text": "hi"}], "unknown key"),
    ([{}], "give one of"),
    ([{"token_ids": []}], "non-empty list"),
    ([{"token_ids": [1, True]}], "non-empty list"),
    ([{"token_ids_file": "/nonexistent/p.json"}], "token_ids_file"),
    ([{"token_ids": [1], "tenant": "../acme"}], "tenant"),
    ([{"token_ids": [1], "extra_key": 5}], "extra_key"),
])
def test_a_bad_entry_stops_the_engine_naming_it(tmp_path: Path, value: Any, reason: str) -> None:
    chain_yaml = write_chain(tmp_path / "tiers.yaml", [
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "fs")}])
    extra = {**extra_config(chain_yaml), "keep_prefixes": value}
    with pytest.raises(ConfigError, match="keep_prefixes") as err:
        KvtierStorage(storage_config(extra))
    assert reason in str(err.value)
