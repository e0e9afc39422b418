"""docs/tenants.md's ``keep_prefixes`` examples for SGLang and LMCache are configurations
the adapters take as written (paths aside: they name files under /etc)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

IDS = list(range(300))  # one full chunk of LMCache's default 256 tokens, and more
DOC = (Path(__file__).parents[2] / "docs" / "tenants.md").read_text()


def example(title: str) -> dict[str, Any]:
    section = DOC[DOC.index(title):]
    code = re.search(r"```json\n(.*?)```", section, re.S)
    assert code is not None
    value: dict[str, Any] = json.loads(code.group(1))
    return value


def files(tmp_path: Path, entries: list[dict[str, Any]]) -> str:
    """The chain's YAML, and each prefix's token ids, here instead of under /etc."""
    ids = tmp_path / "support-bot.json"
    ids.write_text(json.dumps(IDS))
    for entry in entries:
        assert entry["token_ids_file"] == "/etc/kvtier/support-bot.json"
        entry["token_ids_file"] = str(ids)
    chain = tmp_path / "tiers.yaml"
    chain.write_text(yaml.safe_dump({"chain": [
        {"name": "disk", "backend": "fs", "url": str(tmp_path / "fs")}]}))
    return str(chain)


def test_the_sglang_example_is_an_extra_config(tmp_path: Path) -> None:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang 0.5.23 is not installed (make venv installs it)")
    from sglang_host import import_host_pools

    import_host_pools()
    from sglang_pages import storage_config

    from kvtier.contrib.sglang.keep import KeepPrefix
    from kvtier.contrib.sglang.storage import KvtierStorage

    extra = example("**A named prefix, in the SGLang adapter.**")
    extra["kvtier_config"] = files(tmp_path, extra["keep_prefixes"])
    backend = KvtierStorage(storage_config(extra))
    assert backend.tenant == "acme" and backend.interface == "v1"
    assert backend.keep_prefixes == (KeepPrefix("support-bot", None, tuple(IDS), None,
                                                "salt-acme"),)


def test_the_lmcache_example_is_an_adapter_spec(tmp_path: Path) -> None:
    pytest.importorskip("lmcache.v1.distributed.l2_adapters",
                        reason="lmcache is not installed (make venv installs lmcache==0.5.6)")
    from lmcache_driver import build

    from kvtier.contrib.lmcache import ADAPTER_CLASS, ADAPTER_MODULE
    from kvtier.contrib.lmcache.prefixes import KeepPrefix

    spec = example("**A named prefix, in the LMCache adapter.**")
    assert (spec["type"], spec["module_path"], spec["class_name"]) == (
        "plugin", ADAPTER_MODULE, ADAPTER_CLASS)
    params = spec["adapter_params"]
    params["kvtier_config"] = files(tmp_path, params["keep_prefixes"])
    adapter = build(params)  # through LMCache's --l2-adapter parsing and plugin loader
    try:
        settings = adapter.settings
        assert (settings.chunk_size, settings.hash_algorithm) == (256, "blake3")
        assert settings.keep_prefixes == (KeepPrefix("support-bot", None, tuple(IDS), "acme"),)
        assert len(adapter._keeper._chunks) == 1  # its one full chunk of 256 tokens
    finally:
        adapter.close()
