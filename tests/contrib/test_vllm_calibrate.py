"""``kvtier calibrate`` times vLLM's prefill of a model on the CPU (a tiny random Llama,
in a process of its own) and prints a ``recompute`` entry the chain's YAML takes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from shared_pool import engine_env

from kvtier.cli import cli
from kvtier.config.loader import load_config

SUPPORT = Path(__file__).parents[1] / "support"


def test_calibrate_prints_a_recompute_table_the_chain_loads(tmp_path: Path) -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    model = tmp_path / "tiny-llama"
    subprocess.run([sys.executable, str(SUPPORT / "make_tiny_llama.py"), str(model)],
                   check=True, capture_output=True, env=engine_env(False))
    run = subprocess.run(
        [sys.executable, "-m", "kvtier.cli", "calibrate", str(model), "--tokens", "512,128",
         "--repeat", "1", "--dtype", "float32"],
        capture_output=True, text=True, env=engine_env(False), timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [x for x in run.stdout.splitlines() if x.startswith("recompute: ")]
    assert len(lines) == 1, run.stdout
    entry = yaml.safe_load(lines[0])
    assert list(entry["recompute"]) == ["128 tokens", "512 tokens"]
    chain = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}], **entry}
    recompute = load_config(chain).load.recompute
    assert recompute is not None and [t for t, _ in recompute.points] == [128, 512]
    assert all(s > 0 for _, s in recompute.points)


@pytest.mark.parametrize("tokens", ["0", "many", ""])
def test_calibrate_refuses_prompt_lengths_it_cannot_time(tokens: str) -> None:
    result = CliRunner().invoke(cli, ["calibrate", "no-model", "--tokens", tokens])
    assert result.exit_code == 2 and "expected token counts" in result.output
