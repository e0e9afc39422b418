"""``bench/serving.py --quick``: vLLM under load, five KV setups on one trace.

A benchmark, not a speed test: nothing here looks at how fast anything was.
It checks, on the JSON the run prints, that every configuration served every
request of the trace, that the greedy outputs (token ids) are the same in
all of them, and that in the kvtier configurations the tiers below vLLM's
CPU tier really served blocks (the object tier too, where there is one).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).parents[2]
CONFIGS = ["none", "vllm-cpu", "vllm-fs", "kvtier-fs", "kvtier-fs-object"]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("serving")
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "serving.py"), "--quick", "--json",
         "--workdir", str(work)],
        capture_output=True, text=True, timeout=600, check=False)
    assert done.stdout.strip(), done.stderr[-6000:]
    result: dict[str, Any] = json.loads(done.stdout)
    result["returncode"] = done.returncode
    result["stderr"] = done.stderr
    return result


def by_config(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["config"]: r for r in report["configs"]}


def test_every_configuration_completes_every_request(report: dict[str, Any]) -> None:
    runs = by_config(report)
    assert list(runs) == CONFIGS
    expected = report["shape"]["requests"]
    assert expected >= 16 and report["shape"]["concurrency"] > 1
    order = {(s, t) for s, t in _trace_order(report)}
    for name, run in runs.items():
        assert "error" not in run, (name, run.get("log_tail"))
        assert run["summary"]["completed"] == expected, name
        assert {(q["session"], q["turn"]) for q in run["requests"]} == order, name
        for q in run["requests"]:
            assert q["finished"] and len(q["output_ids"]) == report["shape"]["output_tokens"]
            assert q["ttft_s"] is not None and q["e2e_s"] >= q["ttft_s"]
    assert report["returncode"] == 0, report["stderr"][-4000:]


def test_greedy_outputs_are_identical_across_configurations(report: dict[str, Any]) -> None:
    runs = by_config(report)
    reference = {q["id"]: q["output_ids"] for q in runs["none"]["requests"]}
    for name, run in runs.items():
        assert {q["id"]: q["output_ids"] for q in run["requests"]} == reference, name
    assert report["outputs"]["identical"] is True


def test_lower_tiers_serve_in_the_kvtier_configurations(report: dict[str, Any]) -> None:
    runs = by_config(report)
    for name, served in (("kvtier-fs", {"fs"}), ("kvtier-fs-object", {"fs", "object"})):
        tiers = {t["backend"]: t for t in runs[name]["kvtier_tiers"] if t["name"] != "adapter"}
        assert set(tiers) == served, name
        for backend in served:
            assert tiers[backend]["hits"] > 0 and tiers[backend]["bytes_out"] > 0, (name, backend)
        # and the engine used those blocks: prompt tokens it did not compute
        assert runs[name]["summary"]["cached_tokens"] > 0
    assert runs["none"]["summary"]["cached_tokens"] == 0
    assert runs["none"]["kvtier_tiers"] == [] and runs["vllm-fs"]["kvtier_tiers"] == []
    assert runs["vllm-fs"]["vllm_tiers"]["1:fs"]["chunk_hits"] > 0


def test_multi_turn_sessions_come_back_later(report: dict[str, Any]) -> None:
    # the trace's shape: a session's next turn only after other traffic
    order = _trace_order(report)
    first = {}
    for position, (session, turn) in enumerate(order):
        if turn:
            assert position - first[(session, turn - 1)] >= report["shape"]["return_gap"] - 1
        first[(session, turn)] = position
    runs = by_config(report)
    turn_one = {q["id"]: q["prompt_tokens"] for q in runs["none"]["requests"] if q["turn"] == 0}
    assert set(turn_one.values()) == {report["shape"]["system_tokens"]
                                      + report["shape"]["user_tokens"][0]}


def _trace_order(report: dict[str, Any]) -> list[tuple[int, int]]:
    run = by_config(report)["none"]
    return [(q["session"], q["turn"]) for q in sorted(run["requests"],
                                                       key=lambda q: q["start_s"])]
