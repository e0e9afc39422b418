"""A KV-event log recorded from a real vLLM engine (CPU build, tiny random Llama) and planned."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from shared_pool import build_tiny_model, engine_env

from kvtier.cli import cli
from kvtier.plan import lru_curve, read_trace

SUPPORT = Path(__file__).parents[1] / "support"
# 132 tokens: 4 full blocks of 32; P2 shares P1's first 2 blocks
P1 = [(i * 37 + 11) % 500 + 3 for i in range(132)]
P2 = P1[:64] + [(i * 53 + 7) % 500 + 3 for i in range(68)]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_a_log_recorded_from_vllm_replays_its_requests(tmp_path: Path) -> None:
    pytest.importorskip("zmq")
    model = build_tiny_model(tmp_path / "tiny-llama")
    sockets = Path(tempfile.mkdtemp(prefix="kve", dir="/tmp"))  # ipc paths are short
    endpoint, replay = f"ipc://{sockets}/pub", f"ipc://{sockets}/replay"
    prompts = [["p1", P1], ["p2", P2], ["p1", P1], ["p1+full", P1]]
    with open(tmp_path / "vllm.log", "w") as stderr:
        runner = subprocess.Popen(
            [sys.executable, str(SUPPORT / "vllm_events_runner.py"), "--model", model,
             "--prompts", json.dumps(prompts), "--endpoint", endpoint, "--replay", replay],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
            env=engine_env())
    try:
        assert runner.stdout is not None and runner.stdin is not None
        lines = []
        for line in runner.stdout:
            lines.append(line)
            if line.startswith("KVTIER-RUNNER DONE"):
                break
        else:
            pytest.fail(f"vLLM ended early: {(tmp_path / 'vllm.log').read_text()[-3000:]}")
        log = tmp_path / "events.jsonl"
        result = CliRunner().invoke(cli, ["record-events", "--endpoint", endpoint,
                                          "--replay-endpoint", replay, "--out", str(log),
                                          "--seconds", "1"])
        assert result.exit_code == 0, result.output
        runner.stdin.write("\n")
        runner.stdin.flush()
        assert runner.wait(timeout=120) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
        shutil.rmtree(sockets, ignore_errors=True)
    assert "0 undecodable, 0 missed" in result.output
    trace = read_trace(log)
    assert trace.block_tokens == 32
    keys = [r.keys for r in trace.requests]
    # p1 stores its 4 full blocks; p2 reuses 2 from the GPU cache and stores 2 of its
    # own; p1 again computes no new full block: no event, no request; p1 in report
    # mode "full" reports the 4 blocks it reused
    assert len(keys) == 3 and len(keys[0]) == 4 and len(set(keys[0])) == 4
    assert keys[1][:2] == keys[0][:2] and not set(keys[1][2:]) & set(keys[0])
    assert len(keys[1]) == 4 and keys[2] == keys[0]
    assert lru_curve(trace, [100])[0].prefix_hits == 2 + 4
