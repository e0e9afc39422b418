"""docs/tenants.md's worked example (two tenants and a shared system prompt, under LMCache)
runs as written: its chain YAML and its ``--l2-adapter`` JSON, through LMCache's plugin loader."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("lmcache.v1.distributed.l2_adapters",
                    reason="lmcache is not installed (make venv installs lmcache==0.5.6)")

DOC = (Path(__file__).parents[2] / "docs" / "tenants.md").read_text()


def example() -> tuple[dict[str, Any], dict[str, Any]]:
    """The worked example's chain and adapter spec, as the page shows them."""
    section = DOC[DOC.index("**Worked example: two tenants and a shared system prompt.**"):]
    chain = re.search(r"```yaml\n(.*?)```", section, re.S)
    spec = re.search(r"```json\n(.*?)```", section, re.S)
    assert chain is not None and spec is not None
    return yaml.safe_load(chain.group(1)), json.loads(spec.group(1))


@pytest.fixture
def l1() -> Iterator[Any]:
    from lmcache_driver import l1_manager

    yield from l1_manager()


def test_the_worked_example_shares_the_system_prompt_and_nothing_else(
    tmp_path: Path, l1: Any
) -> None:
    from lmcache_driver import build, fetch, fill, objects, okey, store

    chain, spec = example()
    assert (spec["module_path"], spec["class_name"]) == ("kvtier.contrib.lmcache",
                                                        "KvtierL2Adapter")
    chain["chain"][1]["url"] = str(tmp_path / "kvtier")  # the page's path, here
    config = tmp_path / "tiers.yaml"
    config.write_text(yaml.safe_dump(chain))
    adapter = build({**spec["adapter_params"], "kvtier_config": str(config)})
    try:
        system = [0, 1, 2]  # the system prompt's chunks: the same hashes under every salt
        objs = objects(l1, 3)
        prompt = fill(objs, seed=7)
        assert store(adapter, [okey(i, salt="s-system") for i in system], objs).is_successful()
        questions = {"s-acme": 10, "s-globex": 11}
        asked: dict[str, list[bytes]] = {}
        for salt, chunk in questions.items():
            # each customer reads the shared system prompt under its own salt ...
            assert fetch(adapter, l1, [okey(i, salt=salt) for i in system]) == prompt
            # ... and stores its question as its own
            mine = objects(l1, 1)
            asked[salt] = fill(mine, seed=chunk)
            assert store(adapter, [okey(chunk, salt=salt)], mine).is_successful()
        for salt, chunk in questions.items():
            other = questions["s-globex" if salt == "s-acme" else "s-acme"]
            assert fetch(adapter, l1, [okey(chunk, salt=salt)]) == asked[salt]
            assert fetch(adapter, l1, [okey(other, salt=salt)]) == [None]
    finally:
        adapter.close()
