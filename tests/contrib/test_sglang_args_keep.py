"""``kvtier sglang-args --keep-prefix``: named prefixes in the extra config SGLang loads.

The line the command prints is split as a shell would; SGLang 0.5.23's own
parser of the extra config (``parse_storage_backend_extra_config``) reads its
value and SGLang's storage factory builds the backend from it, in SGLang's own
host pool.  The backend then holds the prefixes, and the page keys it keeps
are those SGLang's radix tree gives a node of the prefix's tokens.  Bad input
is refused at the command, naming the option, with exit status 2.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from array import array
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kvtier.cli.main import cli

PREFIX = list(range(1000, 1014))  # three full pages of 4 tokens (sglang_pages.PAGE), and 2 more
LORA, SALT = "lora-7", "salt-acme"


def chain(tmp_path: Path) -> Path:
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump({"chain": [
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "fs")}]}))
    return path


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["sglang-args", *args])


def printed_extra(*args: str) -> str:
    """The value of ``--hicache-storage-backend-extra-config`` in the printed line."""
    result = run(*args)
    assert result.exit_code == 0, result.output
    flags = shlex.split(result.output.splitlines()[1])
    return flags[flags.index("--hicache-storage-backend-extra-config") + 1]


def tree_hashes(tokens: list[int], extra_key: str | None, salt: str | None, page: int) -> list[str]:
    """The page keys SGLang's radix tree gives a node of ``tokens`` under the root."""
    from sglang.srt.mem_cache.radix_cache import RadixKey, TreeNode
    from sglang.srt.mem_cache.utils import compute_node_hash_values

    root = TreeNode()
    root.key, root.hash_value = RadixKey(array("q"), None), []
    node = TreeNode()
    node.parent = root
    node.key = RadixKey(array("q", tokens), extra_key=extra_key, cache_salt=salt)
    return list(compute_node_hash_values(node, page))


def test_the_prefixes_reach_the_backend_sglang_builds_from_the_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang 0.5.23 is not installed (make venv installs it)")
    from sglang_host import import_host_pools, mha_pool

    import_host_pools()  # before SGLang's other modules: see tests/support/sglang_host.py
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (
        HybridCacheController,
    )
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
    from sglang_pages import PAGE, storage_config

    from kvtier.contrib.sglang.keep import KeepPrefix
    from kvtier.contrib.sglang.storage import KvtierStorage

    (tmp_path / "support-bot.json").write_text(json.dumps(PREFIX))
    monkeypatch.chdir(tmp_path)  # a relative file, named by absolute path in the flag
    value = printed_extra(
        str(chain(tmp_path)), "--tenant", "acme",
        "--keep-prefix", f"name=support-bot,token_ids_file=support-bot.json,extra_key={LORA},"
                         f"cache_salt={SALT}",
        "--keep-prefix", "token_ids=[7,8,9,10,11],tenant=acme",
        "--keep-prefix", json.dumps({"name": "json", "token_ids": [3, 4, 5, 6], "cache_salt": ""}))
    extra, *_ = HybridCacheController.parse_storage_backend_extra_config(value)
    assert extra["keep_prefixes"][0]["token_ids_file"] == str(tmp_path / "support-bot.json")
    pool = mha_pool("page_first")
    backend = StorageBackendFactory.create_backend(
        "dynamic", storage_config(extra, is_page_first_layout=True), pool)
    assert isinstance(backend, KvtierStorage)
    try:
        assert backend.tenant == "acme"
        assert backend.keep_prefixes == (
            KeepPrefix("support-bot", None, tuple(PREFIX), LORA, SALT),
            KeepPrefix("prefix-1", "acme", (7, 8, 9, 10, 11)),
            KeepPrefix("json", None, (3, 4, 5, 6)))
        backend.register_mem_pool_host(pool)  # the prefixes are hashed now
        assert backend._keeper is not None
        assert backend._keeper.hashes == {*tree_hashes(PREFIX, LORA, SALT, PAGE)[:3],
                                          *tree_hashes([7, 8, 9, 10], None, None, PAGE),
                                          *tree_hashes([3, 4, 5, 6], None, None, PAGE)}
    finally:
        backend.close()


def test_without_the_option_the_extra_config_names_no_prefix(tmp_path: Path) -> None:
    assert "keep_prefixes" not in json.loads(printed_extra(str(chain(tmp_path))))


@pytest.mark.parametrize(("spec", "reason"), [
    ("support-bot", "expected KEY=VALUE pairs"),
    ("token_ids=[1,2", "'token_ids': expected a JSON list"),
    ("name=bot", "give one of 'token_ids' and 'token_ids_file'"),
    ("token_ids=[1],model_name=m", "unknown key(s) ['model_name']"),
    ("token_ids=[1,-2]", "non-empty list of token ids"),
    ("token_ids_file=nonexistent.json", "'token_ids_file'"),
    ("token_ids=[1],tenant=no/slash", "a tenant is"),
    ("token_ids=[1],tenant=globex", "is not the engine's ('acme')"),
    ('{"token_ids": [1], "extra_key": 5}', "'extra_key': expected a string"),
])
def test_a_bad_prefix_is_refused_naming_the_option(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, reason: str) -> None:
    monkeypatch.chdir(tmp_path)
    result = run(str(chain(tmp_path)), "--tenant", "acme", "--keep-prefix", "token_ids=[5]",
                 "--keep-prefix", spec)
    assert result.exit_code == 2, result.output
    assert f"error: --keep-prefix {spec!r}: " in result.output and reason in result.output
    assert "Traceback" not in result.output and "--hicache" not in result.output


def test_a_prefix_of_another_tenant_than_the_default_engine_s_is_refused(
        tmp_path: Path) -> None:
    result = run(str(chain(tmp_path)), "--keep-prefix", "token_ids=[1],tenant=acme")
    assert result.exit_code == 2 and "is not the engine's ('default')" in result.output
    assert run(str(chain(tmp_path)), "--keep-prefix", "token_ids=[1],tenant=default"
               ).exit_code == 0


def test_a_bad_tenant_is_named_as_the_tenant_option(tmp_path: Path) -> None:
    result = run(str(chain(tmp_path)), "--tenant", "a b", "--keep-prefix", "token_ids=[1]")
    assert result.exit_code == 2 and "error: --tenant: a tenant is" in result.output
