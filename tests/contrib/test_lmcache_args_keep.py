"""``kvtier lmcache-args --keep-prefix``: named prefixes in the adapter LMCache builds.

The whole line the command prints (``--l2-adapter '<json>'``) is split as a
shell would and handed to LMCache 0.5.6's argument parser and adapter factory.
The adapter it builds holds the prefixes, hashed by the ``--chunk-size`` and
``--hash-algorithm`` given: its kept chunks are those of the keys LMCache's
server stores a request of the prefix under.  Bad input is refused at the
command, naming the option, with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kvtier.cli import cli

TOKENS = 16  # the server's --chunk-size here
PREFIX = list(range(2000, 2000 + 3 * TOKENS + 5))  # three full chunks, and 5 tokens more
SALT = "s-acme"


def chain(tmp_path: Path) -> str:
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump({"chain": [
        {"name": "ram", "backend": "host", "capacity": 1 << 20},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/fs"}]}))
    return str(path)


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["lmcache-args", *args])


def printed(*args: str) -> tuple[str, dict[str, Any]]:
    """The command's ``--l2-adapter`` line, and the adapter_params in it."""
    result = run(*args)
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("--l2-adapter ")]
    return line, json.loads(shlex.split(line)[1])["adapter_params"]


def stored_chunks(tokens: list[int], salt: str, algorithm: str) -> list[tuple[str, bytes]]:
    """(salt, chunk hash) of the keys LMCache's server stores a request's chunks under."""
    from lmcache_driver import stored_keys

    return [(k.cache_salt, bytes(k.chunk_hash)) for k in stored_keys(tokens, salt, TOKENS,
                                                                      algorithm)]


@pytest.mark.parametrize("algorithm", ["blake3", "sha256_cbor"])
def test_the_prefixes_reach_the_adapter_lmcache_builds_from_the_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str) -> None:
    pytest.importorskip("lmcache.v1.distributed.l2_adapters",
                        reason="lmcache is not installed (make venv installs lmcache==0.5.6)")
    from lmcache.v1.distributed.l2_adapters import create_l2_adapter
    from lmcache.v1.distributed.l2_adapters.config import (
        add_l2_adapters_args,
        parse_args_to_l2_adapters_config,
    )

    from kvtier.contrib.lmcache import KvtierL2Adapter
    from kvtier.contrib.lmcache.prefixes import KeepPrefix

    (tmp_path / "support-bot.json").write_text(json.dumps(PREFIX))
    monkeypatch.chdir(tmp_path)  # a relative file, named by absolute path in the flag
    path = chain(tmp_path)
    line, params = printed(
        path, "--tenant-of-salt", f"{SALT}=acme", "--tenant-of-salt", "s-sys=public",
        "--shared-tenant", "public", "--chunk-size", str(TOKENS), "--hash-algorithm", algorithm,
        "--keep-prefix", f"name=support-bot,tenant=acme,cache_salt={SALT},"
                         "token_ids_file=support-bot.json",
        "--keep-prefix", f"token_ids={json.dumps(PREFIX[:TOKENS])},cache_salt=s-sys,"
                         "tenant=public,model_name=tiny/llama")
    assert params == {
        "kvtier_config": os.path.abspath(path),
        "tenants": {SALT: "acme", "s-sys": "public"}, "shared_tenants": ["public"],
        "chunk_size": TOKENS, "hash_algorithm": algorithm,
        "keep_prefixes": [
            {"name": "support-bot", "tenant": "acme", "cache_salt": SALT,
             "token_ids_file": str(tmp_path / "support-bot.json")},
            {"token_ids": PREFIX[:TOKENS], "cache_salt": "s-sys", "tenant": "public",
             "model_name": "tiny/llama"}]}
    args = add_l2_adapters_args(argparse.ArgumentParser()).parse_args(shlex.split(line))
    (config,) = parse_args_to_l2_adapters_config(args).adapters
    adapter = create_l2_adapter(config)
    assert isinstance(adapter, KvtierL2Adapter)
    try:
        settings = adapter.settings
        assert (settings.chunk_size, settings.hash_algorithm) == (TOKENS, algorithm)
        assert settings.keep_prefixes == (
            KeepPrefix("support-bot", "acme", tuple(PREFIX), SALT),
            KeepPrefix("prefix-1", "public", tuple(PREFIX[:TOKENS]), "s-sys", "tiny/llama"))
        mine = stored_chunks([*PREFIX, 1, 2, 3], SALT, algorithm)[:3]
        shared = stored_chunks(PREFIX[:TOKENS], "s-sys", algorithm)
        assert dict(adapter._keeper._chunks) == {
            **{chunk: {None} for chunk in mine}, shared[0]: {"tiny/llama"}}
    finally:
        adapter.close()


def test_without_the_option_the_adapter_names_no_prefix(tmp_path: Path) -> None:
    _, params = printed(chain(tmp_path))
    assert params == {"kvtier_config": os.path.abspath(chain(tmp_path))}


@pytest.mark.parametrize(("args", "spec", "reason"), [
    ([], "support-bot", "expected KEY=VALUE pairs"),
    ([], "token_ids=[1,2", "'token_ids': expected a JSON list"),
    ([], "name=bot", "give one of 'token_ids' and 'token_ids_file'"),
    ([], "token_ids=[1],extra_key=x", "unknown key(s) ['extra_key']"),
    ([], "token_ids_file=nonexistent.json", "'token_ids_file'"),
    ([], "token_ids=[1,2,3]", "3 token ids, less than a chunk of 256"),
    (["--chunk-size", "4"], "token_ids=[1,2,3]", "less than a chunk of 4"),
    # the keys of a salt are its tenant's; a prefix named for another keeps nothing
    (["--chunk-size", "4", "--tenant-of-salt", "s-acme=acme"],
     "token_ids=[1,2,3,4],cache_salt=s-acme,tenant=globex",
     "the keys of cache_salt 's-acme' are tenant 'acme''s"),
    (["--chunk-size", "4", "--tenants-by-salt"],
     "token_ids=[1,2,3,4],cache_salt=globex,tenant=acme", "are tenant 'globex''s"),
    (["--chunk-size", "4"], "token_ids=[1,2,3,4],tenant=acme",
     "the keys of cache_salt '' are tenant 'default''s"),
    (["--chunk-size", "4", "--tenant-of-salt", "s=public", "--shared-tenant", "public"],
     "token_ids=[1,2,3,4],cache_salt=s,tenant=acme", "are tenant 'default''s"),
])
def test_a_bad_prefix_is_refused_naming_the_option(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], spec: str,
        reason: str) -> None:
    monkeypatch.chdir(tmp_path)
    result = run(chain(tmp_path), *args, "--keep-prefix", spec)
    assert result.exit_code == 2, result.output
    assert f"error: --keep-prefix {spec!r}: " in result.output and reason in result.output
    assert "Traceback" not in result.output and "--l2-adapter" not in result.output


@pytest.mark.parametrize(("args", "spec"), [
    (["--tenant-of-salt", "s-acme=acme"], "token_ids=[1,2,3,4],cache_salt=s-acme,tenant=acme"),
    (["--tenants-by-salt"], "token_ids=[1,2,3,4],cache_salt=globex,tenant=globex"),
    # a shared tenant's blocks are the default tenant's: so are those of unnamed salts
    (["--tenant-of-salt", "s=public", "--shared-tenant", "public"],
     "token_ids=[1,2,3,4],cache_salt=s,tenant=public"),
    ([], "token_ids=[1,2,3,4],tenant=default"),
])
def test_a_prefix_of_its_salt_s_tenant_is_taken(
        tmp_path: Path, args: list[str], spec: str) -> None:
    _, params = printed(chain(tmp_path), "--chunk-size", "4", *args, "--keep-prefix", spec)
    assert len(params["keep_prefixes"]) == 1


@pytest.mark.parametrize(("args", "reason"), [
    (["--chunk-size", "0"], "chunk_size must be a positive integer"),
    (["--hash-algorithm", ""], "hash_algorithm must be the server's"),
])
def test_bad_hashing_options_are_refused(tmp_path: Path, args: list[str], reason: str) -> None:
    result = run(chain(tmp_path), *args)
    assert result.exit_code == 2 and reason in result.output, result.output
    assert "Traceback" not in result.output
