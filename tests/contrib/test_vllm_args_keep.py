"""``kvtier vllm-args --keep-prefix``: named prefixes in the secondary tier vLLM builds.

The line the command prints is split as a shell would; vLLM 0.32's own argument
parser (``EngineArgs``'s ``--kv-transfer-config``) reads its value into a
``KVTransferConfig``, and vLLM's secondary-tier factory builds kvtier's tier from
its ``secondary_tiers`` entry.  The tier then holds the prefixes, and the block
hashes it keeps are those vLLM's scheduler gives a request of the prefix's tokens.
Bad input is refused at the command, naming the option, with exit status 2.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from vllm_chain import SpecStub, write_yaml

from kvtier.cli.main import cli
from kvtier.spec import ConfigError

PREFIX = list(range(3, 3 + 70))  # two full blocks of 32 tokens (SpecStub's), and 6 more
SALT = "salt-acme"


def chain(tmp_path: Path) -> Path:
    return write_yaml(tmp_path / "tiers.yaml", [
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "fs")}])


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["vllm-args", *args])


def printed_flag(*args: str) -> str:
    """The value of ``--kv-transfer-config`` in the printed line, split as a shell would."""
    result = run(*args)
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("--kv-transfer-config "))
    flags = shlex.split(line)
    assert flags[0] == "--kv-transfer-config" and len(flags) == 2
    return flags[1]


def vllm_parses(value: str) -> Any:
    """The ``KVTransferConfig`` vLLM's own argument parser makes of the flag's value."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    return EngineArgs.from_cli_args(parser.parse_args(
        ["--kv-transfer-config", value])).kv_transfer_config


def engine_hashes(prompt: list[int], salt: str | None) -> list[bytes]:
    """The block hashes vLLM's scheduler gives a request of ``prompt`` (sha256, seeded)."""
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(fn)
    request = Request("r", prompt, SamplingParams(max_tokens=1), None, cache_salt=salt,
                      block_hasher=get_request_block_hasher(32, fn))
    return [bytes(h) for h in request.block_hashes]


def test_the_prefixes_reach_the_tier_vllm_builds_from_the_flag(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    from kvtier.contrib.vllm.keep_prefixes import KeepPrefix
    from kvtier.contrib.vllm.tier import KvtierTier

    (tmp_path / "support-bot.json").write_text(json.dumps(PREFIX))
    monkeypatch.chdir(tmp_path)  # a relative file, named by absolute path in the flag
    value = printed_flag(
        str(chain(tmp_path)), "--tenant", "acme",
        "--keep-prefix", f"name=support-bot,token_ids_file=support-bot.json,cache_salt={SALT}",
        "--keep-prefix", f"token_ids={json.dumps(PREFIX[:40])},tenant=globex",
        "--keep-prefix", json.dumps({"name": "bob's", "token_ids": [3, 4], "cache_salt": ""}))
    config = vllm_parses(value)
    (entry,) = config.kv_connector_extra_config["secondary_tiers"]
    assert entry["keep_prefixes"][0]["token_ids_file"] == str(tmp_path / "support-bot.json")
    spec = SpecStub(4096)
    region = np.zeros((4, 4096), dtype=np.uint8)
    tier = SecondaryTierFactory.create_secondary_tier(entry, memoryview(region), spec)
    assert isinstance(tier, KvtierTier)
    try:
        assert tier._options.tenant == "acme"
        assert tier._options.keep_prefixes == (
            KeepPrefix("support-bot", None, tuple(PREFIX), SALT),
            KeepPrefix("prefix-1", "globex", tuple(PREFIX[:40])),
            KeepPrefix("bob's", None, (3, 4)))
        want_acme = engine_hashes(PREFIX, SALT)[:2]  # before the tier hashes: vLLM seeded
        want_globex = engine_hashes(PREFIX[:40], None)[:1]
        assert tier._keeper._tenant_hashes() == {"acme": frozenset(want_acme),
                                                 "globex": frozenset(want_globex)}
    finally:
        tier.shutdown()


@pytest.mark.parametrize(("spec", "reason"), [
    ("support-bot", "expected KEY=VALUE pairs"),
    ("token_ids=[1,2", "'token_ids': expected a JSON list"),
    ("name=bot", "give one of 'token_ids' and 'token_ids_file'"),
    ("token_ids=[1],extra_key=k", "unknown key(s) ['extra_key']"),
    ("token_ids=[1,-2]", "non-empty list of token ids"),
    ("token_ids_file=nonexistent.json", "'token_ids_file'"),
    ("token_ids=[1],tenant=no/slash", "a tenant is"),
    ("token_ids=[1],tenant=globex", "is not the engine's ('acme')"),
    ('{"token_ids": [1], "cache_salt": 5}', "'cache_salt': expected a string"),
])
def test_a_bad_prefix_is_refused_naming_the_option(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, reason: str) -> None:
    monkeypatch.chdir(tmp_path)
    result = run(str(chain(tmp_path)), "--tenant", "acme", "--ignore-client-tenants",
                 "--keep-prefix", "token_ids=[5]", "--keep-prefix", spec)
    assert result.exit_code == 2, result.output
    assert f"error: --keep-prefix {spec!r}: " in result.output and reason in result.output
    assert "Traceback" not in result.output and "--kv-transfer-config" not in result.output


def test_another_tenant_s_prefix_is_refused_only_where_clients_tenants_are_ignored(
        tmp_path: Path) -> None:
    other = "token_ids=[1],tenant=acme"
    result = run(str(chain(tmp_path)), "--ignore-client-tenants", "--keep-prefix", other)
    assert result.exit_code == 2 and "is not the engine's ('default')" in result.output
    # a tier that reads each request's tenant may be sent acme's requests
    (entry,) = json.loads(printed_flag(str(chain(tmp_path)), "--keep-prefix", other))[
        "kv_connector_extra_config"]["secondary_tiers"]
    assert entry["keep_prefixes"] == [{"token_ids": [1], "tenant": "acme"}]
    assert run(str(chain(tmp_path)), "--ignore-client-tenants", "--keep-prefix",
               "token_ids=[1],tenant=default").exit_code == 0
    # without the option, the entry names no prefix
    (entry,) = json.loads(printed_flag(str(chain(tmp_path))))[
        "kv_connector_extra_config"]["secondary_tiers"]
    assert "keep_prefixes" not in entry


def test_the_function_names_a_bad_prefix_by_its_place(tmp_path: Path) -> None:
    from kvtier.contrib.vllm import kv_transfer_config

    with pytest.raises(ConfigError, match="keep_prefixes") as err:
        kv_transfer_config(chain(tmp_path), keep_prefixes=[{"token_ids": [1]}, {"name": "x"}])
    assert "prefix 1: give one of 'token_ids' and 'token_ids_file'" in str(err.value)
    extra = kv_transfer_config(chain(tmp_path), keep_prefixes=[{"token_ids": [1]}])[
        "kv_connector_extra_config"]
    assert extra["secondary_tiers"][0]["keep_prefixes"] == [{"token_ids": [1]}]
