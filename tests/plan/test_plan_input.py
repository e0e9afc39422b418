"""kvtier plan and record-events refuse bad input before they start: one line, exit 2.

Each case names the option, or the file and line; an option the others leave
without effect is refused too.  And the numbers plan prints agree with each
other: one unit in every table, a recommendation within the budget given,
no tier that adds nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from kvtier.cli import cli
from kvtier.config.units import parse_size
from kvtier.plan import read_trace

ROWS = '{"hash_ids": [1, 2, 3]}\n{"hash_ids": [1, 2]}\n{"hash_ids": [1, 4]}\n'


def plan(*args: str) -> Result:
    return CliRunner().invoke(cli, ["plan", *args])


def refused(result: Result, *words: str) -> str:
    """The one error line of a run that exited 2 without a traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(ROWS)
    return path


@pytest.mark.parametrize(("args", "option"), [
    (["--capacity", "0"], "--capacity"),
    (["--capacity", "-3"], "--capacity"),
    (["--ram", "banana"], "--ram"),
    (["--ram", "1ZiB"], "--ram"),  # not a unit kvtier's sizes take
    (["--ram", "1MiB"], "--ram"),  # less than one 64 MiB block: was a 64 MiB RAM tier
    (["--bytes-per-token", "0"], "--bytes-per-token"),
    (["--block-tokens", "0"], "--block-tokens"),
    (["--engines", "2", "--capacity", "0"], "--capacity"),
    (["--engines", "2", "--router", "sticky", "--balance", "nan"], "--balance"),
    (["--engines", "2", "--router", "sticky", "--balance", "inf"], "--balance"),
    # options that would have no effect
    (["--admit", "3"], "--admit has no effect without --below or --engines"),
    (["--below-eviction", "s3fifo"], "--below-eviction has no effect without --below"),
    (["--write", "through"], "--write has no effect without --below or --engines"),
    (["--pool", "4"], "--pool has no effect without --engines"),
    (["--router", "sticky"], "--router has no effect without --engines"),
    (["--balance", "2"], "--balance has no effect without --engines"),
    (["--engines", "2", "--balance", "2"], "--balance has no effect with --router round-robin"),
    (["--engines", "2", "--no-belady"], "--belady/--no-belady has no effect with --engines"),
    (["--engines", "2", "--capacity", "2", "--ram", "1GiB"], "--ram has no effect with"),
])
def test_bad_options_are_one_line_naming_the_option(
    trace: Path, args: list[str], option: str
) -> None:
    refused(plan(str(trace), *args), option)


@pytest.mark.parametrize("generated", ["prompts:-5", "prompts:0", "prompts:x", "nothing:3"])
def test_a_generated_trace_needs_a_kind_and_requests(generated: str) -> None:
    refused(plan("--generate", generated), "--generate")


@pytest.mark.parametrize(("text", "line", "reason"), [
    ('{"hash_ids": [1, 2]}\n{"hash_ids": [1, null]}\n', 2, "got null"),
    ('{"hash_ids": [1, [2, 3]]}\n', 1, "got [2, 3]"),
    ('{"hash_ids": [{"a": 1}]}\n', 1, 'got {"a": 1}'),
    ('{"hash_ids": [Infinity]}\n', 1, "Infinity is not a number plan reads"),
    ('{"hash_ids": [NaN]}\n', 1, "NaN is not a number plan reads"),
    ('{"hash_ids": [1.2, 1.7]}\n', 1, "got 1.2"),  # was cut into block 1, twice
    ('{"hash_ids": [1], "input_length": 1.5e3}\n', 1, "input_length"),
    ('{"kvtier_trace": 1, "sample": null}\n{"op": "lookup", "keys": [1]}\n', 1,
     "sample is a share above 0 and at most 1, got null"),
    ('{"kvtier_trace": 1, "sample": 0}\n{"op": "lookup", "keys": [1]}\n', 1, "got 0"),
    ('{"kvtier_trace": 1}\n{"op": "lookup", "keys": [1]}\n{"op": "get", "keys": [0.5]}\n', 3,
     "got 0.5"),
])
def test_bad_trace_lines_are_one_line_naming_file_and_line(
    tmp_path: Path, text: str, line: int, reason: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    refused(plan(str(path)), f"Error: {path}:{line}: ", reason)


@pytest.mark.parametrize("text", [
    "", "\n\n", '{"hash_ids": []}\n', '{"kvtier_trace": 1, "sample": 0.5}\n',
    '{"kvtier_events": 1}\n{"t": 0, "seq": 0, "events": []}\n',
])
def test_a_trace_without_blocks_is_an_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(text)
    refused(plan(str(path)), f"{path}: no requests with blocks to replay")


def test_a_trace_file_with_generate_is_an_error(trace: Path) -> None:
    refused(plan(str(trace), "--generate", "prompts:5"), "a TRACE file or --generate, not both")


@pytest.mark.parametrize("option", ["--chart", "--save-trace"])
def test_output_into_a_missing_folder_is_refused_before_the_replay(
    trace: Path, tmp_path: Path, option: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvtier.plan.cli

    def no_replay(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the replay started")

    monkeypatch.setattr(kvtier.plan.cli, "make_plan", no_replay)
    refused(plan(str(trace), option, str(tmp_path / "missing" / "out")), option,
            "does not exist")


def test_json_with_a_chart_keeps_stdout_json(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    import kvtier.plan.cli

    # a stand-in for matplotlib, which may be missing: what is printed where is under test
    monkeypatch.setattr(importlib.import_module("kvtier.plan.chart"), "find_spec",
                        lambda name: object(), raising=False)
    monkeypatch.setattr(kvtier.plan.cli, "write_chart",
                        lambda plan, path: Path(path).write_bytes(b"png") and None)
    chart = tmp_path / "c.png"
    result = plan(str(trace), "--json", "--policy", "lru", "--chart", str(chart))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["trace"]["references"] == 7
    assert result.stderr == f"chart: {chart}\n" and chart.read_bytes() == b"png"


def test_record_events_refuses_a_bad_endpoint_and_folder(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    for args, words in [
        (["--endpoint", "bogus://x"], ("--endpoint", "bogus://x")),
        (["--replay-endpoint", "nothing"], ("--replay-endpoint",)),
        (["--endpoint", "tcp://no host"], ("--endpoint",)),
        (["--seconds", "nan"], ("--seconds", "finite")),
    ]:
        result = CliRunner().invoke(cli, ["record-events", "--out", str(out), "--seconds", "0",
                                          *args])
        refused(result, *words)
    result = CliRunner().invoke(cli, ["record-events", "--out", str(tmp_path / "no" / "e.jsonl"),
                                      "--seconds", "0"])
    refused(result, "--out", "does not exist")
    assert not out.exists()


def recording(path: Path, *runs: tuple[dict[str, Any], list[list[int]]]) -> Path:
    with path.open("w") as f:
        for head, lookups in runs:
            f.write(json.dumps({"kvtier_trace": 1, **head}) + "\n")
            for keys in lookups:
                f.write(json.dumps({"t": 0, "op": "lookup", "keys": keys}) + "\n")
    return path


HIGH = 3 << 62  # above half the hash space: a sample of 0.5 drops a call beginning with it


def test_runs_of_a_recording_are_read_each_with_its_header(tmp_path: Path) -> None:
    path = recording(tmp_path / "rec.jsonl",
                     ({"sample": 1.0, "block_tokens": 16}, [[1, 2], [HIGH, 5], [1, 2, 3]]),
                     ({"sample": 0.5, "block_tokens": 16}, [[1, 2, 4], [7]]))
    trace = read_trace(path)
    # read at the lower sample: the first run's call that it would not have kept is dropped
    assert trace.sample == 0.5 and trace.block_tokens == 16
    assert [r.keys for r in trace.requests] == [(1, 2), (1, 2, 3), (1, 2, 4), (7,)]
    mixed = recording(tmp_path / "mixed.jsonl", ({"sample": 1.0, "block_tokens": 16}, [[1]]),
                      ({"sample": 1.0, "block_tokens": 32}, [[1]]))
    refused(plan(str(mixed)), f"{mixed}:3: this run's blocks hold 32 tokens, the first run's "
                              "(line 1) 16")


def test_block_tokens_is_refused_where_the_recording_names_its_own(tmp_path: Path) -> None:
    path = recording(tmp_path / "rec.jsonl", ({"sample": 1.0, "block_tokens": 16}, [[1], [1]]))
    refused(plan(str(path), "--block-tokens", "32"), "--block-tokens has no effect",
            "16 tokens a block")
    assert plan(str(path), "--block-tokens", "16", "--policy", "lru").exit_code == 0


def test_a_sampled_trace_shows_blocks_of_the_full_traffic_in_every_table(tmp_path: Path) -> None:
    lookups = [[k, k + 1, k + 2] for k in range(0, 40, 3)] * 3
    path = recording(tmp_path / "rec.jsonl", ({"sample": 0.25, "block_tokens": 16}, lookups))
    args = [str(path), "--policy", "lru", "--capacity", "4", "--capacity", "10", "--below", "6",
            "--admit", "1"]
    out = json.loads(plan(*args, "--json").output)
    assert [p["capacity_full"] for p in out["curves"]["lru"]] == [16, 40]
    assert [(r["ram"], r["ram_full"], r["below"], r["below_full"]) for r in out["below"]] == [
        (4, 16, 6, 24), (10, 40, 6, 24)]
    table = plan(*args).output
    assert "over 24 blocks below" in table and "(blocks of the full traffic)" in table
    below = table[table.index("over 24 blocks below"):]
    rows = [line.split("│")[1].strip() for line in below.splitlines() if line.count("│") > 3]
    assert rows == ["16", "40"]  # the main table's capacities


def test_the_recommended_ram_stays_within_the_budget(tmp_path: Path) -> None:
    # a sample of 0.3 and a budget of 5 blocks: 1.5 blocks of the trace, which rounded
    # to 2 stood for 7 blocks of the full traffic
    lookups = [[k, k + 1] for k in range(0, 30, 2)] * 2
    path = recording(tmp_path / "rec.jsonl", ({"sample": 0.3, "block_tokens": 16}, lookups))
    budget = 5 * 16 * 1024
    out = json.loads(plan(str(path), "--policy", "lru", "--ram", str(budget),
                          "--bytes-per-token", "1024", "--json").output)
    ram = yaml.safe_load(out["recommended"])["chain"][0]
    assert 0 < parse_size(ram["capacity"]) <= budget
    # 1536 MiB is 24 blocks of 64 MiB: written as 1536MiB, not rounded up to 2GiB
    out = json.loads(plan("--generate", "scan:200:1", "--policy", "lru", "--ram", "1536MiB",
                          "--json").output)
    assert yaml.safe_load(out["recommended"])["chain"][0]["capacity"] == "1536MiB"


def test_a_disk_tier_that_adds_nothing_is_not_recommended() -> None:
    result = plan("--generate", "scan:1000:1", "--no-belady", "--policy", "lru", "--policy",
                  "s3fifo", "--ram", "8GiB", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    ceiling = out["ceiling"]["prefix_hits"]
    ram = next(p for p in out["curves"]["s3fifo"] if p["capacity"] == 128)  # 8GiB: 128 blocks
    disk = next(p for p in out["curves"]["lru"] if p["prefix_hits"] >= 0.95 * ceiling)
    assert disk["capacity"] > ram["capacity"] and disk["prefix_hits"] <= ram["prefix_hits"]
    chain = yaml.safe_load(out["recommended"])["chain"]
    assert [t["name"] for t in chain] == ["ram"]
    assert "no disk: LRU's 47GiB serves" in out["recommended"]


def test_a_balance_above_the_engines_is_no_bound() -> None:
    args = ["plan", "--generate", "prompts:60:2", "--engines", "3", "--router", "sticky",
            "--capacity", "4", "--pool", "0", "--json"]
    free = json.loads(CliRunner().invoke(cli, args).output)["fleet"]
    result = CliRunner().invoke(cli, [*args, "--balance", "1e308"])
    assert result.exit_code == 0, result.output
    huge = json.loads(result.output)["fleet"]
    assert [p["per_engine"] for p in huge] == [p["per_engine"] for p in free]
    assert huge[0]["balance"] == 1e308


def test_an_event_without_a_parent_starts_a_request(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    stored = [{"type": "BlockStored", "block_hashes": [1, 2], "block_size": 16},
              {"type": "BlockStored", "block_hashes": [1, 2, 3], "block_size": 16}]
    path.write_text(json.dumps({"kvtier_events": 1}) + "\n"
                    + json.dumps({"t": 0, "seq": 0, "events": stored}) + "\n")
    assert [r.keys for r in read_trace(path).requests] == [(1, 2), (1, 2, 3)]
    result = plan(str(path), "--policy", "lru", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["ceiling"]["prefix_hits"] == 2
