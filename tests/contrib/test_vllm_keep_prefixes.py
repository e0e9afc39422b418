"""The vLLM tier's ``keep_prefixes``: a named prefix's blocks found by vLLM's own hashes,
and kept in its tenant's chain.

The hashes are checked against those vLLM's scheduler gives a ``Request`` (its own
block hasher, salt included); the marks are made in a real host chain with a keep
budget.  The engine run is tests/contrib/test_vllm_keep_engine.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvtier.chain.tenants import open_tenants
from kvtier.contrib.vllm.keep_prefixes import (
    KeepPrefix,
    PrefixKeeper,
    parse_keep_prefixes,
)
from kvtier.spec import ConfigError

PREFIX = list(range(3, 3 + 100))  # three full blocks of 32 tokens, and 4 tokens more


@pytest.fixture(scope="module")
def seeded() -> Any:
    """vLLM's hash seed, set as the engine sets it (sha256, its default)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(fn)
    return fn


def engine_hashes(fn: Any, prompt: list[int], salt: str | None) -> list[bytes]:
    """The block hashes vLLM's scheduler gives a request of ``prompt``."""
    from vllm import SamplingParams
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    request = Request("r", prompt, SamplingParams(max_tokens=1), None, cache_salt=salt,
                      block_hasher=get_request_block_hasher(32, fn))
    return [bytes(h) for h in request.block_hashes]


@pytest.mark.parametrize("salt", [None, "salt-acme"])
def test_the_prefix_hashes_are_the_engine_s(seeded: Any, salt: str | None) -> None:
    from kvtier.contrib.vllm._compat import prefix_block_hashes

    prompt = PREFIX + [7] * 60  # the prefix, then more: its first three blocks are the prefix's
    ours = prefix_block_hashes(PREFIX, 32, salt)
    assert ours is not None and len(ours) == 3
    assert ours == engine_hashes(seeded, prompt, salt)[:3]
    # another salt, or a token changed, and no block matches
    assert not set(ours) & set(engine_hashes(seeded, prompt, "other"))
    assert not set(ours) & set(engine_hashes(seeded, [4, *prompt[1:]], salt))


def test_options_read_token_ids_inline_or_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps([1, 2, 3]))
    assert parse_keep_prefixes([
        {"token_ids": [5, 6]},
        {"name": "system", "tenant": "acme", "token_ids_file": str(path), "cache_salt": "s"},
    ]) == (KeepPrefix("prefix-0", None, (5, 6)), KeepPrefix("system", "acme", (1, 2, 3), "s"))


@pytest.mark.parametrize(("value", "reason"), [
    ({"token_ids": [1]}, "expected a list"),
    ([[1, 2]], "expected a mapping"),
    ([{"token_ids": [1], "text": "hi"}], "unknown key"),
    ([{}], "give one of"),
    ([{"token_ids": [1], "token_ids_file": "x"}], "give one of"),
    ([{"token_ids": []}], "non-empty list"),
    ([{"token_ids": [1, -2]}], "non-empty list"),
    ([{"token_ids": [1, True]}], "non-empty list"),
    ([{"token_ids": "1 2"}], "non-empty list"),
    ([{"token_ids_file": "/nonexistent/p.json"}], "token_ids_file"),
    ([{"token_ids": [1], "tenant": "../acme"}], "tenant"),
    ([{"token_ids": [1], "cache_salt": 5}], "cache_salt"),
])
def test_a_bad_entry_stops_the_tier_naming_it(value: Any, reason: str) -> None:
    from kvtier.contrib.vllm.tier_options import TierOptions

    with pytest.raises(ConfigError, match="keep_prefixes") as err:
        TierOptions.checked("KvtierTier", config="tiers.yaml", namespace_extra=None,
                            model_name=None, keep_host_tier=False, lookup_timeout=2,
                            verdict_ttl=2, failed_ttl=30, job_workers=1, reopen_interval=30,
                            locality=None, load_timeout=None, keep_prefixes=value)
    assert reason in str(err.value)


@pytest.fixture
def chains() -> Iterator[dict[str, Any]]:
    """Two tenants' host chains, each with room for 8 blocks, 4 of them kept."""
    config = {"chain": [{"name": "ram", "backend": "host", "capacity": "8KiB",
                         "tenants": {"*": {"keep": "4KiB"}}}]}
    tenants = open_tenants(config, {"model": "m"})
    yield {t: tenants.chain(t) for t in ("acme", "default", "common")}
    tenants.close()


def keeper(chains: dict[str, Any], hashes: Any = None, **kw: Any) -> PrefixKeeper:
    """A keeper of prefix ``A`` (acme's) and ``B`` (the shared tenant's), whose block
    hashes are their tokens' bytes (a key is the hash and 4 bytes of group)."""
    def block_hashes(ids: Any, per: int, salt: str | None) -> list[bytes] | None:
        return [bytes(ids[i:i + per]) for i in range(0, len(ids) - per + 1, per)]

    prefixes = [KeepPrefix("A", "acme", (1, 2, 3, 4, 5)), KeepPrefix("B", "common", (9, 9))]
    return PrefixKeeper(chains.get, threading.RLock(), prefixes, tenant="default",
                        shared=frozenset({"common"}), tokens_per_hash=2,
                        block_hashes=hashes or block_hashes,
                        block_hash_of=lambda k: k[:-4], **kw)


def key(*tokens: int) -> bytes:
    return bytes(tokens) + bytes(4)


def put(chain: Any, keys: list[bytes]) -> None:
    chain.put(keys, [bytes(1024)] * len(keys))


def kept(made: PrefixKeeper, want: int) -> int:
    deadline = time.monotonic() + 10
    while made.kept < want and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    return made.kept


def test_the_prefix_blocks_a_tenant_stores_are_kept(chains: dict[str, Any]) -> None:
    made = keeper(chains)
    try:
        acme = [key(1, 2), key(3, 4), key(5, 6)]  # the prefix's two full blocks, then not
        put(chains["acme"], acme)
        made.done("acme", acme, load=False)
        assert kept(made, 2) == 2
        for i in range(40):  # a flood of acme's other blocks
            put(chains["acme"], [b"other-%d" % i])
        assert chains["acme"].get_bytes(acme[:2]) == [bytes(1024)] * 2
        assert chains["acme"].get_bytes(acme[2:]) == [None]
    finally:
        made.close()


def test_another_tenant_s_blocks_of_the_same_tokens_are_not(chains: dict[str, Any]) -> None:
    made = keeper(chains)
    try:
        blocks = [key(1, 2), key(3, 4)]
        put(chains["default"], blocks)
        made.done("default", blocks, load=False)  # acme's prefix, another tenant's request
        assert kept(made, 1) == 0
        shared = [key(9, 9)]  # the shared tenant's prefix: its requests are the default's
        put(chains["default"], shared)
        made.done("default", shared, load=False)
        assert kept(made, 1) == 1
    finally:
        made.close()


def test_an_engine_whose_own_tenant_is_shared_keeps_its_prefix(chains: dict[str, Any]) -> None:
    # its requests come under its own name where they name none (or the client's name
    # is ignored), under the default's where they name it (Tenancy.of): both are kept
    made = PrefixKeeper(chains.get, threading.RLock(), [KeepPrefix("C", None, (7, 7))],
                        tenant="common", shared=frozenset({"common"}), tokens_per_hash=2,
                        block_hashes=lambda ids, per, salt: [bytes(ids[:2])],
                        block_hash_of=lambda k: k[:-4])
    try:
        blocks = [key(7, 7)]
        put(chains["common"], blocks)
        made.done("common", blocks, load=False)  # an unnamed request
        assert kept(made, 1) == 1
        put(chains["default"], blocks)
        made.done("default", blocks, load=False)  # one naming the shared tenant
        assert kept(made, 2) == 2
    finally:
        made.close()


def test_loaded_prefix_blocks_are_marked_once(chains: dict[str, Any]) -> None:
    made = keeper(chains)
    try:
        blocks = [key(1, 2), key(3, 4)]
        put(chains["acme"], blocks)
        made.done("acme", blocks, load=True)
        assert kept(made, 2) == 2
        made.done("acme", blocks, load=True)  # loaded again: not marked again
        assert kept(made, 4) == 2
        made.done("acme", blocks, load=False)  # stored again: marked again
        assert kept(made, 4) == 4
    finally:
        made.close()


def test_nothing_is_kept_until_vllm_has_seeded_its_hashes(chains: dict[str, Any]) -> None:
    seeded = threading.Event()

    def hashes(ids: Any, per: int, salt: str | None) -> list[bytes] | None:
        return [bytes(ids[:2]), bytes(ids[2:4])] if seeded.is_set() else None

    made = keeper(chains, hashes)
    try:
        blocks = [key(1, 2), key(3, 4)]
        put(chains["acme"], blocks)
        made.done("acme", blocks, load=False)
        assert kept(made, 1) == 0
        seeded.set()
        made.done("acme", blocks, load=False)
        assert kept(made, 2) == 2
    finally:
        made.close()
