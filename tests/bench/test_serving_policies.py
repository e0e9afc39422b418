"""``bench/serving.py --policies``: a trace on which the CPU tier's policy matters.

No engine runs here (``tests/bench/test_serving.py`` runs the bench itself;
``tests/contrib/test_vllm_cache_policy_engine.py`` runs kvtier's policies in
the engine): the trace's reuse structure and the settings each
configuration gives vLLM are checked directly.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).parents[2] / "bench"


@pytest.fixture(scope="module")
def serving() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("serving_under_test", BENCH / "serving.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


@pytest.mark.parametrize("size", ["FULL", "QUICK"])
def test_hot_prompts_return_after_more_kv_than_the_cpu_tier_holds(
    serving: ModuleType, size: str
) -> None:
    shape = serving.hot_scan(getattr(serving, size))
    trace = serving.build_trace(shape)
    sessions, order = trace["sessions"], trace["order"]
    assert len(order) == len(sessions) == shape.requests
    systems = [sessions[s]["system"] for s, turn in order]
    assert all(turn == 0 for _, turn in order)
    assert systems[:4] == [0, 1, 0, 1]  # the hot prompts, used twice at first
    uses = {0: [i for i, s in enumerate(systems) if s == 0],
            1: [i for i, s in enumerate(systems) if s == 1]}
    assert len(uses[0]) == len(uses[1]) == 2 + shape.rounds
    others = [s for s in systems if s > 1]
    assert len(others) == len(set(others))  # one-off documents, each used once
    per_request = (shape.system_tokens + 64) * shape.kv_bytes_per_token
    for used in uses.values():
        for earlier, later in itertools.pairwise(used[1:]):  # after the warm-up
            between = later - earlier - 1  # other requests: KV the tier must take in between
            assert between * per_request > shape.cpu_tier_bytes


def test_policy_configurations_load_kvtiers_classes_in_vllms_cpu_tier(
    serving: ModuleType, tmp_path: Path
) -> None:
    shape = serving.hot_scan(serving.QUICK)
    names = ["vllm-cpu", *serving.POLICY_CONFIGS]
    plans = serving.transfer_configs(shape, tmp_path, names, None)
    extra = {name: plans[name]["kv_connector_extra_config"] for name in names}
    assert "eviction_policy" not in extra["vllm-cpu"]  # vLLM's own lru
    for name, cls in (("vllm-cpu-s3fifo", "S3FifoCachePolicy"),
                      ("vllm-cpu-adaptive", "AdaptiveCachePolicy")):
        assert extra[name]["eviction_policy"] == cls
        assert extra[name]["cache_policy_module_path"] == "kvtier.contrib.vllm.cache_policy"
        assert extra[name]["secondary_tiers"] == []
        assert extra[name]["cpu_bytes_to_use"] == extra["vllm-cpu"]["cpu_bytes_to_use"]
