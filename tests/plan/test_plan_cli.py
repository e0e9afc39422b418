"""kvtier plan reads Mooncake and recorded traces and reports through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from kvtier.cli import cli
from kvtier.plan import generate, lru_curve, read_trace, write_mooncake
from kvtier.plan.below import replay_below


def test_mooncake_lines_carry_the_prompt_tokens_of_each_block(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [7, 8, 9]}\n'
        "\n"
        '{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [7, 8]}\n'
    )
    trace = read_trace(path)
    assert [r.keys for r in trace.requests] == [(7, 8, 9), (7, 8)]
    assert [r.tokens for r in trace.requests] == [(512, 512, 76), (512, 88)]
    point = lru_curve(trace, [10])[0]
    assert (point.prefix_hits, point.prefix_tokens, point.references) == (2, 600, 5)


def test_a_bad_line_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"hash_ids": [1]}\n{"hash_ids": 3}\n')
    result = CliRunner().invoke(cli, ["plan", str(path)])
    assert result.exit_code == 2 and (
        f"Error: {path}:2: a Mooncake line's hash_ids needs a list of integer block hashes\n"
    ) == result.output


def test_a_recording_uses_its_lookups_as_requests(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    rows = [
        {"kvtier_trace": 1, "sample": 0.5, "block_tokens": 32},
        {"t": 0.0, "op": "lookup", "keys": [1, 2]},
        {"t": 0.1, "op": "put", "keys": [1, 2]},
        {"t": 0.2, "op": "lookup", "keys": [1, 2, 3]},
        {"t": 0.3, "op": "get", "keys": [1, 2]},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    trace = read_trace(path)
    assert trace.sample == 0.5 and trace.block_tokens == 32
    assert [r.keys for r in trace.requests] == [(1, 2), (1, 2, 3)]
    assert trace.requests[1].tokens == (32, 32, 32)


def test_plan_json_reports_curves_bounds_and_a_chain_that_loads(tmp_path: Path) -> None:
    trace_path = tmp_path / "sessions.jsonl"
    write_mooncake(generate("sessions", 300, seed=2), trace_path)
    result = CliRunner().invoke(cli, [
        "plan", str(trace_path), "--json", "--capacity", "50", "--capacity", "400",
        "--bytes-per-token", "1024",
    ])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    trace = read_trace(trace_path)
    assert plan["trace"]["references"] == trace.references
    assert plan["capacities"] == [50, 400]
    lru = lru_curve(trace, [50, 400])
    assert [row["prefix_hits"] for row in plan["curves"]["lru"]] == [p.prefix_hits for p in lru]
    assert set(plan["curves"]) == {"lru", "arc", "s3fifo", "adaptive"}
    ceiling = plan["ceiling"]["prefix_hits"]
    for name, rows in plan["curves"].items():
        assert all(row["prefix_hits"] <= ceiling for row in rows), name
    assert [b["capacity"] for b in plan["belady"]] == [50, 400]
    chain = yaml.safe_load(plan["recommended"])["chain"]
    assert chain[0]["backend"] == "host" and chain[0]["eviction"] in plan["curves"]
    from kvtier.config.chain_config import load_config

    assert load_config({"chain": chain}).tiers[0].name == "ram"


def test_plan_table_and_chart_note(tmp_path: Path) -> None:
    chart = tmp_path / "curves.png"
    result = CliRunner().invoke(cli, [
        "plan", "--generate", "scan:200:1", "--policy", "lru", "--ram", "1GiB",
        "--chart", str(chart),
    ])
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # refused before the replay: the option would have no effect
        assert result.exit_code == 2, result.output
        assert "Error: --chart has no effect: matplotlib is not installed" in result.output
        assert not chart.exists()
    else:
        assert result.exit_code == 0, result.output
        assert "infinite" in result.output and "recommended chain:" in result.output
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_below_eviction_rows_and_the_recommended_fs_tier() -> None:
    args = ["plan", "--generate", "scan:600:1", "--policy", "lru", "--no-belady", "--ram",
            "2GiB", "--below", "150", "--admit", "1", "--json"]
    plain = json.loads(CliRunner().invoke(cli, args).output)
    assert all("below_eviction" not in row for row in plain["below"])
    fs = yaml.safe_load(plain["recommended"])["chain"][1]
    assert fs["backend"] == "fs" and "eviction" not in fs
    result = CliRunner().invoke(cli, [*args, "--below-eviction", "lru",
                                      "--below-eviction", "s3fifo"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    trace = generate("scan", 600, seed=1)
    rows = out["below"]
    assert [row["below_eviction"] for row in rows] == ["lru", "s3fifo"] * len(out["capacities"])
    for row in rows:
        point = replay_below(trace, "lru", row["ram"], 150, "back", 1, row["below_eviction"])
        assert (row["from_ram"], row["from_below"], row["written_below"]) == (
            point.from_ram, point.from_below, point.written_below)
    assert [row["from_below"] for row in rows[::2]] == [
        row["from_below"] for row in plain["below"]]
    # s3fifo served more of the scan from below than lru: the fs tier evicts s3fifo
    assert sum(r["from_below"] for r in rows[1::2]) > sum(r["from_below"] for r in rows[::2])
    chain = yaml.safe_load(out["recommended"])["chain"]
    assert chain[1] == {**fs, "eviction": "s3fifo"}
    from kvtier.config.chain_config import load_config

    assert load_config({"chain": chain}).tiers[1].name == "disk"
    # s3fifo alone was not compared with lru: the fs tier keeps its default
    alone = json.loads(CliRunner().invoke(cli, [*args, "--below-eviction", "s3fifo"]).output)
    assert "eviction" not in yaml.safe_load(alone["recommended"])["chain"][1]


def admission_plan(kind: str) -> dict[str, object]:
    result = CliRunner().invoke(cli, [
        "plan", "--generate", f"{kind}:4000:1", "--policy", "lru", "--no-belady", "--ram",
        "16GiB", "--below", "800", "--admit", "1", "--admit", "3", "--admit", "9",
        "--admit", "9:0.2", "--admit", "17", "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def test_the_recommended_fs_tier_admits_what_writes_least_within_a_point() -> None:
    out = admission_plan("documents")
    disk = yaml.safe_load(str(out["recommended"]))["chain"][1]
    assert (disk["admit"], disk.get("admit_sample")) == (9, None)
    rows = [r for r in out["below"] if r["ram"] == 256]  # 16GiB of 64MiB blocks
    assert [(r["admit"], r["admit_sample"]) for r in rows] == [
        (1, 0.0), (3, 0.0), (9, 0.0), (9, 0.2), (17, 0.0)]
    every, *others = rows
    within = [r for r in others if r["prefix_ratio"] >= every["prefix_ratio"] - 0.01]
    chosen = min(within, key=lambda r: r["written_below"])
    assert (chosen["admit"], chosen["admit_sample"]) == (9, 0.0)
    # admit 17 writes less still, but costs more than a point: not chosen
    assert rows[4]["written_below"] < chosen["written_below"]
    assert rows[4]["prefix_ratio"] < every["prefix_ratio"] - 0.01
    replayed = replay_below(generate("documents", 4000, seed=1), "lru", 256, 800, "back", 9,
                            "lru", 0.2)
    assert (replayed.written_below, replayed.admit_sample) == (
        rows[3]["written_below"], 0.2)
    from kvtier.config.chain_config import load_config

    assert load_config({"chain": [yaml.safe_load(str(out["recommended"]))["chain"][0],
                                  disk]}).tiers[1].admit == 9


def test_no_admission_is_recommended_where_every_one_costs_more_than_a_point() -> None:
    out = admission_plan("sessions")
    assert "admit" not in yaml.safe_load(str(out["recommended"]))["chain"][1]
    assert "disk admission" not in str(out["recommended"])


def test_admit_values_are_checked() -> None:
    for value, reason in [("0", "admit is 1 (every block) or more calls"),
                          ("1:0.5", "admit_sample: has no meaning with admit: 1"),
                          ("3:1.5", "admit_sample: expected a share from 0 to 1, got 1.5"),
                          ("3:x", "expected N or N:SAMPLE")]:
        result = CliRunner().invoke(cli, ["plan", "--generate", "prompts:50", "--below", "10",
                                          "--admit", value])
        assert result.exit_code == 2 and reason in result.output, result.output
