"""The LMCache adapter's ``keep_prefixes``: a named prefix's chunks found by LMCache's own
hashes, kept in its tenant's chain through a flood.

Adapters come from LMCache's own ``--l2-adapter`` parsing and factory, buffers
are its L1 memory objects (``lmcache_driver``); the keys are those LMCache's
server makes for a request's tokens: its store path (``MPCacheServerContext.resolve_obj_keys``,
a session's chunk hashes) and its token lookups (``resolve_object_keys``).  The
tier is a real ``fs`` pool with room for a few chunks and a keep budget.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

lmcache = pytest.importorskip(
    "lmcache.v1.distributed.l2_adapters",
    reason="lmcache is not installed (make venv installs lmcache==0.5.6)",
)

from lmcache.v1.multiprocess.cache_control.key_resolver import resolve_object_keys  # noqa: E402
from lmcache.v1.multiprocess.token_hasher import TokenHasher  # noqa: E402
from lmcache_driver import (  # noqa: E402
    CHUNK,
    MODEL,
    build,
    fetch,
    fill,
    objects,
    okey,
    store,
    write_yaml,
)
from lmcache_driver import stored_keys as driver_stored_keys  # noqa: E402

from kvtier.contrib.lmcache.prefixes import KeepPrefix, parse_keep_prefixes  # noqa: E402

TOKENS = 16  # tokens per LMCache chunk here (the server's --chunk-size)
PREFIX = list(range(2000, 2000 + 3 * TOKENS + 5))  # three full chunks, and 5 tokens more
PROMPT = PREFIX + list(range(70, 70 + 2 * TOKENS - 5))  # five chunks in all


def stored_keys(tokens: list[int], salt: str, algorithm: str = "blake3") -> list[Any]:
    """The keys LMCache's server stores a request's chunks under, chunks of TOKENS."""
    return driver_stored_keys(tokens, salt, TOKENS, algorithm)


def adapter(tmp_path: Path, entry: dict[str, Any], name: str = "tiers.yaml",
            **params: Any) -> Any:
    """An adapter with a tenant per salt on an fs pool with room for about 10 chunks,
    each tenant keeping 4, whose ``keep_prefixes`` is ``[entry]`` (none if empty)."""
    chain = write_yaml(tmp_path / name, [{
        "name": "disk", "backend": "fs", "url": f"file://{tmp_path}/fs",
        "capacity": 10 * (CHUNK + 4096), "direct_io": False,
        "tenants": {"*": {"keep": 4 * (CHUNK + 4096)}}}])
    ids = tmp_path / "support-bot.json"
    ids.write_text(json.dumps(PREFIX))
    prefixes = [{"name": "support-bot", "token_ids_file": str(ids), **entry}] if entry else []
    return build({"kvtier_config": chain, "tenants": "salt", "keep_prefixes": prefixes,
                  "chunk_size": TOKENS, **params})


def flood(made: Any, l1: Any) -> None:
    """40 chunks of acme's other prompts, 4 at a time."""
    objs = objects(l1, 4)
    for batch in range(10):
        fill(objs, seed=100 + batch)
        keys = [okey(1000 + 4 * batch + i, salt="acme") for i in range(4)]
        assert store(made, keys, objs).is_successful()
    l1.free(objs)


def test_the_prefix_chunks_are_the_server_s_keys(tmp_path: Path) -> None:
    # blake3, the server's default: another algorithm (builtin, sha256_cbor) makes
    # LMCache's hasher seed vLLM's own hash state in this process, which vLLM's tests read
    algorithm = "blake3"
    made = adapter(tmp_path, {"cache_salt": "acme"}, hash_algorithm=algorithm)
    try:
        keeper = made._keeper
        stored = stored_keys(PROMPT, "acme", algorithm)
        looked_up, chunks = resolve_object_keys(
            TokenHasher(chunk_size=TOKENS, hash_algorithm=algorithm), MODEL, 1, PROMPT, "acme")
        assert chunks == 5 and looked_up == stored
        assert {h for _, h in keeper._chunks} == {bytes(k.chunk_hash) for k in stored[:3]}
        assert [keeper._ours(k) for k in stored] == [True] * 3 + [False] * 2
        # another salt, or a token changed: no chunk is the prefix's
        assert not any(keeper._ours(k) for k in stored_keys(PROMPT, "globex", algorithm))
        assert not any(keeper._ours(k) for k in stored_keys([1, *PROMPT[1:]], "acme", algorithm))
    finally:
        made.close()


def test_the_prefix_chunks_survive_a_flood_and_the_rest_go(tmp_path: Path, l1: Any) -> None:
    made = adapter(tmp_path, {"cache_salt": "acme"})  # its tenant: the salt's, acme
    try:
        keys = stored_keys(PROMPT, "acme")
        objs = objects(l1, 5)
        want = fill(objs, seed=7)
        assert store(made, keys, objs).is_successful()
        made._keeper.wait(10)
        assert made._keeper.kept == 3
        flood(made, l1)
        assert fetch(made, l1, keys) == want[:3] + [None] * 2  # byte for byte
        disk = made._tenancy.chain_of("acme").stats()["tiers"][0]
        assert disk["evictions"] > 0 and disk["keep_refused"] == 0
    finally:
        made.close()


def test_a_prefix_loaded_from_an_earlier_run_is_kept(tmp_path: Path, l1: Any) -> None:
    keys = stored_keys(PROMPT, "acme")
    first = adapter(tmp_path, {}, name="first.yaml")  # stored, nothing kept
    objs = objects(l1, 5)
    want = fill(objs, seed=8)
    assert store(first, keys, objs).is_successful()
    first.close()
    made = adapter(tmp_path, {"cache_salt": "acme"})
    try:
        assert fetch(made, l1, keys[:4]) == want[:4]  # loaded: its three prefix chunks kept
        made._keeper.wait(10)
        fetch(made, l1, keys[:4])  # loaded again: not marked again
        made._keeper.wait(10)
        assert made._keeper.kept == 3
        flood(made, l1)
        assert fetch(made, l1, keys) == want[:3] + [None] * 2
    finally:
        made.close()


def test_a_prefix_named_for_another_tenant_keeps_nothing(tmp_path: Path, l1: Any) -> None:
    made = adapter(tmp_path, {"cache_salt": "acme", "tenant": "globex"})
    try:
        assert not made._keeper
        keys = stored_keys(PROMPT, "acme")
        objs = objects(l1, 5)
        fill(objs, seed=9)
        assert store(made, keys, objs).is_successful()
        made._keeper.wait(10)
        flood(made, l1)
        assert fetch(made, l1, keys) == [None] * 5
    finally:
        made.close()


def test_entries_read_token_ids_inline_or_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps([1, 2, 3]))
    assert parse_keep_prefixes([
        {"token_ids": [5, 6]},
        {"name": "system", "tenant": "acme", "token_ids_file": str(path), "cache_salt": "s",
         "model_name": "m"},
    ]) == (KeepPrefix("prefix-0", None, (5, 6)), KeepPrefix("system", "acme", (1, 2, 3), "s", "m"))


@pytest.mark.parametrize(("params", "match"), [
    ({"keep_prefixes": {"token_ids": [1]}}, "expected a list"),
    ({"keep_prefixes": [{"token_ids": [1], "text": "hi"}]}, "unknown key"),
    ({"keep_prefixes": [{}]}, "give one of"),
    ({"keep_prefixes": [{"token_ids": [1, -2]}]}, "non-empty list"),
    ({"keep_prefixes": [{"token_ids_file": "/nonexistent/p.json"}]}, "token_ids_file"),
    ({"keep_prefixes": [{"token_ids": [1], "tenant": "../acme"}]}, "tenant"),
    ({"keep_prefixes": [{"token_ids": [1], "cache_salt": 5}]}, "cache_salt"),
    ({"chunk_size": 0}, "chunk_size"), ({"hash_algorithm": ""}, "hash_algorithm"),
])
def test_bad_keep_params_stop_lmcache(tmp_path: Path, params: dict[str, Any],
                                      match: str) -> None:
    chain = write_yaml(tmp_path / "tiers.yaml", [
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/fs"}])
    with pytest.raises(ValueError, match=match):
        build({"kvtier_config": chain, **params})
