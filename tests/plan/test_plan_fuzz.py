"""Fuzz: kvtier plan and record-events, given any options and trace lines, exit 0 or 2.

Hypothesis draws options (good values and bad ones: zero, negative, NaN,
infinity, unknown units, missing folders, options without effect) and tiny
traces (Mooncake lines, recordings, event logs, lines that are not JSON) and
runs each in process with click's runner.  A run ends with 0 (it planned) or
2 (a one-line error), never with a traceback; a run with --json that
succeeds prints JSON alone on stdout.
"""

from __future__ import annotations

import atexit
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvtier.cli import cli

# one folder for every example (hypothesis runs many per test function), removed at exit
FOLDER = Path(tempfile.mkdtemp(prefix="kvtier-plan-fuzz-"))
atexit.register(shutil.rmtree, FOLDER, True)
MISSING = str(FOLDER / "missing" / "out")

numbers = st.one_of(
    st.integers(-3, 40), st.sampled_from([0, 1 << 63, (1 << 64) + 5, -(1 << 70)]),
    st.floats(allow_nan=True, allow_infinity=True, width=32), st.booleans(), st.none(),
)
values = st.recursive(numbers | st.text(max_size=3),
                      lambda inner: st.lists(inner, max_size=2)
                      | st.dictionaries(st.text(max_size=2), inner, max_size=2), max_leaves=4)
keys = st.lists(st.integers(0, 12), max_size=5) | st.lists(values, max_size=3) | values


def mooncake() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"hash_ids": keys}, optional={
        "input_length": numbers, "timestamp": numbers, "session_id": values})


def recorded() -> st.SearchStrategy[dict[str, Any]]:
    header = st.fixed_dictionaries({"kvtier_trace": st.just(1)}, optional={
        "sample": st.sampled_from([1.0, 0.5, 0.25]) | numbers, "block_tokens": numbers})
    call = st.fixed_dictionaries({"op": st.sampled_from(["lookup", "get", "put", "x"]),
                                  "keys": keys}, optional={"t": numbers})
    return header | call


def events() -> st.SearchStrategy[dict[str, Any]]:
    stored = st.fixed_dictionaries({"type": st.just("BlockStored"), "block_hashes": keys},
                                   optional={"parent_block_hash": numbers | st.integers(0, 12),
                                             "block_size": numbers, "medium": values,
                                             "group_idx": numbers})
    return st.just({"kvtier_events": 1}) | st.fixed_dictionaries(
        {"t": numbers, "seq": numbers, "events": st.lists(stored | values, max_size=3) | values})


def line(row: Any) -> str:
    return json.dumps(row)  # NaN and infinity as JSON's readers write them: NaN, Infinity


trace_lines = st.one_of(
    st.lists(mooncake().map(line), max_size=4),
    st.lists(recorded().map(line), max_size=5),
    st.lists(events().map(line), max_size=4),
    st.lists(st.one_of(mooncake().map(line), recorded().map(line), values.map(line),
                       st.text(max_size=6)), max_size=4),
)

good_keys = st.lists(st.integers(0, 12), min_size=1, max_size=5)
good_lines = st.one_of(
    st.lists(st.fixed_dictionaries({"hash_ids": good_keys}, optional={
        "input_length": st.integers(0, 2000), "session_id": st.integers(0, 3)}).map(line),
        min_size=1, max_size=5),
    st.tuples(st.fixed_dictionaries({"kvtier_trace": st.just(1), "sample": st.sampled_from(
        [1.0, 0.5]), "block_tokens": st.sampled_from([0, 16])}).map(line),
        st.lists(st.fixed_dictionaries({"op": st.sampled_from(["lookup", "get", "put"]),
                                         "keys": good_keys}).map(line), min_size=1, max_size=5)
    ).map(lambda head_calls: [head_calls[0], *head_calls[1]]),
    st.lists(st.fixed_dictionaries({"type": st.just("BlockStored"), "block_hashes": good_keys,
                                    "block_size": st.just(16)},
                                   optional={"parent_block_hash": st.integers(0, 12)}),
             min_size=1, max_size=3).map(
        lambda stored: [line({"kvtier_events": 1}), line({"t": 0, "seq": 0, "events": stored})]),
)

# each option: values that work, then values that do not
OPTIONS: dict[str, tuple[list[str], list[str]]] = {
    "--capacity": (["1", "3", "40"], ["0", "-2", "x", "1e3"]),
    "--ram": (["1GiB", "64MiB", "2.5GiB", "99999999999TiB"],
              ["1MiB", "0", "banana", "1EiB", "nan", "-1GiB"]),
    "--block-tokens": (["16", "512"], ["0", "-1"]),
    "--bytes-per-token": (["1024", "131072", "1"], ["0", "x"]),
    "--policy": (["lru", "arc", "s3fifo", "adaptive"], ["bogus"]),
    "--below": (["1", "4"], ["0", "nan"]),
    "--below-eviction": (["lru", "s3fifo"], ["fifo"]),
    "--admit": (["1", "3", "3:0.5"], ["0", "3:nan", "3:inf", "1:0.5", "x"]),
    "--write": (["back", "through"], ["around"]),
    "--engines": (["1", "2"], ["0", "-1"]),
    "--router": (["round-robin", "sticky", "prefix"], ["random"]),
    "--balance": (["0", "1", "2.5", "1e308"], ["0.5", "-1", "nan", "inf"]),
    "--pool": (["0", "2"], ["-1", "x"]),
    "--generate": (["prompts:3", "sessions:4:1", "scan:2:5", "documents:2", "prompts:2:-1"],
                   ["prompts:-5", "prompts:0", "bogus:3", "scan:x"]),
    "--save-trace": ([str(FOLDER / "saved.jsonl")], [MISSING, str(FOLDER)]),
    "--chart": ([str(FOLDER / "c.png")], [MISSING]),
}
FLAGS = ["--json", "--no-belady", "--belady"]
#: The options each way of running plan uses: one cache, --below, a fleet.
MODES = [
    ["--capacity", "--ram", "--policy", "--bytes-per-token"],
    ["--capacity", "--ram", "--policy", "--below", "--below-eviction", "--admit", "--write"],
    ["--capacity", "--policy", "--below", "--below-eviction", "--write", "--engines",
     "--router", "--pool"],
]


@st.composite
def plan_args(draw: st.DrawFn) -> tuple[list[str], list[str] | None]:
    """Mostly options that work together on a trace that reads; the rest anything."""
    args: list[str] = []
    if draw(st.booleans()):
        mode = draw(st.sampled_from(MODES))
        for option in draw(st.lists(st.sampled_from(mode), max_size=4, unique=True)):
            args += [option, draw(st.sampled_from(OPTIONS[option][0]))]
        if "--engines" in mode:
            args += ["--engines", draw(st.sampled_from(OPTIONS["--engines"][0]))]
        elif draw(st.booleans()):
            args.append("--no-belady")
        args += draw(st.lists(st.just("--json"), max_size=1))
        if draw(st.booleans()):
            return args, draw(good_lines)
        return [*args, "--generate", draw(st.sampled_from(OPTIONS["--generate"][0]))], None
    for option in draw(st.lists(st.sampled_from(sorted(OPTIONS)), max_size=5)):
        args += [option, draw(st.sampled_from([v for vs in OPTIONS[option] for v in vs]))]
    args += draw(st.lists(st.sampled_from(FLAGS), max_size=2))
    return args, draw(st.none() | trace_lines | good_lines)


def ended_cleanly(result: Result) -> None:
    assert result.exit_code in (0, 2), (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception)
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert sum(line.startswith("Error: ") for line in result.output.splitlines()) == 1, (
            result.output)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(plan_args())
def test_plan_exits_0_or_2_on_any_options_and_trace(case: tuple[list[str], list[str] | None]
                                                     ) -> None:
    args, lines = case
    trace: list[str] = []
    if lines is not None:
        path = FOLDER / "trace.jsonl"
        path.write_text("".join(f"{text}\n" for text in lines))
        trace = [str(path)]
    result = CliRunner().invoke(cli, ["plan", *trace, *args])
    event(f"exit {result.exit_code}")
    ended_cleanly(result)
    if result.exit_code == 0 and "--json" in args:
        out = json.loads(result.stdout)
        for row in out.get("below", []):
            assert row["ram_full"] >= row["ram"] >= 1
        assert all(math.isfinite(v) for v in _numbers(out))


def _numbers(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return [value] if isinstance(value, float) else []


RECORD: dict[str, st.SearchStrategy[str]] = {
    # a port nothing listens on (connecting is lazy), and endpoints no transport takes
    "--endpoint": st.sampled_from(["tcp://127.0.0.1:9", "inproc://kvtier-fuzz", "bogus://x",
                                   "tcp://", "tcp://no host:1", "", "ipc://" + MISSING]),
    "--replay-endpoint": st.sampled_from(["bogus://x", "x", "tcp://"]),
    "--out": st.sampled_from([str(FOLDER / "events.jsonl"), MISSING, str(FOLDER)]),
    "--batches": st.sampled_from(["1", "0", "x"]),
    "--topic": st.sampled_from(["", "kv", "\u00e9"]),
}


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(sorted(RECORD)), max_size=4, unique=True).flatmap(
    lambda names: st.tuples(*(st.tuples(st.just(n), RECORD[n]) for n in names))),
    st.sampled_from(["0", "0.01", "nan", "inf", "-1", "x"]), st.booleans())
def test_record_events_exits_0_or_2(options: tuple[tuple[str, str], ...], seconds: str,
                                    bind: bool) -> None:
    args = [word for pair in options for word in pair]
    if "--out" not in args:
        args += ["--out", str(FOLDER / "events.jsonl")]
    args += ["--seconds", seconds, *(["--bind"] if bind else [])]
    result = CliRunner().invoke(cli, ["record-events", *args])
    event(f"exit {result.exit_code}")
    ended_cleanly(result)
