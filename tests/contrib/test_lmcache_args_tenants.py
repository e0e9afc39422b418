"""``kvtier lmcache-args`` enables tenants: its flag, parsed by LMCache 0.5.6's own loader.

The whole line the command prints (``--l2-adapter '<json>'``) is split as a
shell would and handed to LMCache's argument parser and adapter factory; the
adapter it builds then keeps the tenants' blocks apart and serves the shared
system prompt to every tenant, byte for byte, through LMCache's L1 memory
objects (``lmcache_driver``) and real tiers (host RAM and fs).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

lmcache = pytest.importorskip(
    "lmcache.v1.distributed.l2_adapters",
    reason="lmcache is not installed (make venv installs lmcache==0.5.6)",
)

from click.testing import CliRunner  # noqa: E402
from lmcache.v1.distributed.l2_adapters import create_l2_adapter  # noqa: E402
from lmcache.v1.distributed.l2_adapters.config import (  # noqa: E402
    add_l2_adapters_args,
    parse_args_to_l2_adapters_config,
)
from lmcache_driver import fetch, fill, host_fs, objects, okey, store  # noqa: E402

from kvtier.cli import cli  # noqa: E402
from kvtier.contrib.lmcache import KvtierL2Adapter  # noqa: E402

MAPPING = ["--tenant-of-salt", "s-acme=acme", "--tenant-of-salt", "s-globex=globex",
           "--tenant-of-salt", "s-sys=public", "--shared-tenant", "public"]


@pytest.fixture
def built() -> Iterator[list[KvtierL2Adapter]]:
    adapters: list[KvtierL2Adapter] = []
    yield adapters
    for adapter in adapters:
        adapter.close()


def lmcache_builds(line: str, built: list[KvtierL2Adapter]) -> KvtierL2Adapter:
    """The adapter LMCache's server builds from the printed line, as a shell splits it."""
    args = add_l2_adapters_args(argparse.ArgumentParser()).parse_args(shlex.split(line))
    (config,) = parse_args_to_l2_adapters_config(args).adapters
    adapter = create_l2_adapter(config)
    assert isinstance(adapter, KvtierL2Adapter)
    built.append(adapter)
    return adapter


def printed(*args: str) -> tuple[str, dict[str, Any]]:
    """The command's ``--l2-adapter`` line, and the adapter_params in it."""
    result = CliRunner().invoke(cli, ["lmcache-args", *args])
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("--l2-adapter ")]
    return line, json.loads(shlex.split(line)[1])["adapter_params"]


def test_the_tenant_flags_reach_lmcache_and_keep_tenants_apart(
        tmp_path: Path, l1: Any, built: list[KvtierL2Adapter]) -> None:
    path = host_fs(tmp_path)
    line, params = printed(path, *MAPPING)
    assert params == {"kvtier_config": os.path.abspath(path),
                      "tenants": {"s-acme": "acme", "s-globex": "globex", "s-sys": "public"},
                      "shared_tenants": ["public"]}
    adapter = lmcache_builds(line, built)
    assert adapter.settings.shared_tenants == frozenset({"public"})
    system = [okey(i, salt="s-sys") for i in range(3)]
    objs = objects(l1, 3)
    prompt = fill(objs, seed=11)
    assert store(adapter, system, objs).is_successful()
    mine = objects(l1, 1)
    private = fill(mine, seed=12)
    assert store(adapter, [okey(9, salt="s-acme")], mine).is_successful()
    # every tenant reads the shared prompt; globex never reads acme's own block
    assert fetch(adapter, l1, [okey(i, salt="s-globex") for i in range(3)]) == prompt
    assert fetch(adapter, l1, [okey(9, salt="s-acme")]) == private
    assert fetch(adapter, l1, [okey(9, salt="s-globex")]) == [None]


def test_a_tenant_per_salt(tmp_path: Path, l1: Any, built: list[KvtierL2Adapter]) -> None:
    path = host_fs(tmp_path)
    line, params = printed(path, "--tenants-by-salt")
    assert params == {"kvtier_config": os.path.abspath(path), "tenants": "salt"}
    alone = CliRunner().invoke(cli, ["lmcache-args", path, "--tenants-by-salt", "--json-only"])
    assert json.loads(alone.output) == json.loads(shlex.split(line)[1])
    adapter = lmcache_builds(line, built)
    objs = objects(l1, 2)
    data = fill(objs, seed=13)
    assert store(adapter, [okey(i, salt="acme") for i in range(2)], objs).is_successful()
    assert fetch(adapter, l1, [okey(i, salt="acme") for i in range(2)]) == data
    assert fetch(adapter, l1, [okey(i, salt="globex") for i in range(2)]) == [None, None]
    assert sorted(adapter._tenancy.opened()) == ["acme", "default", "globex"]


@pytest.mark.parametrize("args,match", [
    (["--tenants-by-salt", "--tenant-of-salt", "s=acme"], "exclude each other"),
    (["--tenant-of-salt", "acme"], "expected SALT=TENANT"),
    (["--tenant-of-salt", "s=acme", "--tenant-of-salt", "s=globex"], "given to 'acme'"),
    (["--tenant-of-salt", "s=no/slash"], "tenant name"),
    (["--shared-tenant", "public"], "needs adapter_params.tenants"),
])
def test_bad_tenant_flags_are_refused(tmp_path: Path, args: list[str], match: str) -> None:
    result = CliRunner().invoke(cli, ["lmcache-args", host_fs(tmp_path), *args])
    assert result.exit_code == 2 and match in result.output, result.output


def test_the_documented_command_prints_the_documented_adapter(tmp_path: Path) -> None:
    """docs/tenants.md's worked example: its command gives its --l2-adapter's tenants."""
    doc = (Path(__file__).parents[2] / "docs" / "tenants.md").read_text()
    section = doc[doc.index("**Worked example: two tenants and a shared system prompt.**"):]
    spec = json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])
    command = section.split("```\nkvtier lmcache-args ", 1)[1].split("```", 1)[0]
    args = shlex.split(command.replace("\\\n", " "))
    assert args[0] == spec["adapter_params"]["kvtier_config"]
    _, params = printed(host_fs(tmp_path), *args[1:])
    documented = {k: v for k, v in spec["adapter_params"].items() if k != "kvtier_config"}
    assert {k: v for k, v in params.items() if k != "kvtier_config"} == documented
