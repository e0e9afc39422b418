"""The ``kvtier bench`` command: runs the sections, prints tables or JSON."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kvtier import console as output
from kvtier.config.units import parse_size
from kvtier.tierbench import twin
from kvtier.tierbench.runner import (
    BUILTIN,
    BenchSettings,
    Progress,
    machine,
    run_tiers,
    settings_dict,
)

__all__ = ["bench_command", "render"]

SECTIONS = ("tiers", "dispatch", "lookup", "codec")


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def render(report: dict[str, Any], console: Console) -> None:
    """The report as tables."""
    m = report["machine"]
    console.print(f"{m['cpus']} CPUs ({m['cpu']}), Python {m['python']}, "
                  f"load average {m['load_average']} at start, {m['time']}; "
                  f"copy and checksum: {m.get('copy_and_checksum', '-')}", highlight=False)
    tiers = report.get("tiers")
    if tiers:
        s = report["settings"]
        table = Table(title=f"tiers: batches of {s['blocks']} x {s['block_size']} B, "
                            f"{s['rounds']} rounds (GB/s = 10^9 B/s; latency per batch; "
                            "median: kvtier/raw of the median batch times)")
        for col in ("tier", "op", "kvtier GB/s", "p50 ms", "p99 ms", "raw", "raw GB/s",
                    "raw p50", "raw p99", "kvtier/raw", "median", "verified"):
            table.add_column(col, justify="left" if col in ("tier", "op", "raw") else "right")
        for row in tiers["results"]:
            kv = row["kvtier"]
            raws = row["raw"] or [None]
            for i, raw in enumerate(raws):
                first = i == 0
                table.add_row(
                    f"{row['tier']} ({row['backend']})" if first else "",
                    row["op"] if first else "",
                    _fmt(kv["gbps"], 3) if first else "",
                    _fmt(kv["p50_ms"]) if first else "",
                    _fmt(kv["p99_ms"]) if first else "",
                    raw["name"] if raw else row.get("note", "-"),
                    _fmt(raw["gbps"], 3) if raw else "-",
                    _fmt(raw["p50_ms"]) if raw else "-",
                    _fmt(raw["p99_ms"]) if raw else "-",
                    f"{raw['ratio']:.2f}x" if raw and raw["ratio"] is not None else "-",
                    f"{raw['ratio_p50']:.2f}x" if raw and raw["ratio_p50"] is not None else "-",
                    ("yes" if row["verified"] else "[red]NO[/]") if first else "",
                )
        console.print(table)
        for note in tiers["notes"]:
            console.print(f"note: {note}", highlight=False)
        for row in tiers["results"]:
            for raw in row["raw"]:
                if raw["name"] == twin.LABEL and raw["ratio_p50"]:
                    console.print(f"encryption: {row['tier']} {row['op']} costs "
                                  f"{_signed(raw.get('cost_paired_pct'))}% over the same tier "
                                  "in plaintext (median of the rounds' ratios; "
                                  f"{100 * (1 / raw['ratio_p50'] - 1):+.1f}% from the median "
                                  "batch times)", highlight=False)
    d = report.get("dispatch")
    if d:
        table = Table(title=f"pluggy dispatch, host backend, batch of {d['batch']}")
        for col in ("call", "through pluggy", "direct", "difference"):
            table.add_column(col)
        table.add_row("lookup (batch)", f"{d['lookup_hook_us']:.2f} us",
                      f"{d['lookup_direct_us']:.2f} us", f"{d['overhead_per_call_us']:.2f} us")
        table.add_row(f"get_into (batch of {d['block_size']} B)",
                      f"{d['get_into_hook_ms']:.3f} ms", f"{d['get_into_direct_ms']:.3f} ms",
                      f"{d['get_into_hook_ms'] - d['get_into_direct_ms']:+.3f} ms")
        console.print(table)
        console.print(f"dispatch overhead per call: {d['overhead_per_call_us']:.2f} us = "
                      f"{_fmt(d['overhead_vs_one_block_pct'], 3)}% of one {d['block_size']} B "
                      f"get_into ({d['one_block_get_into_us']:.0f} us), "
                      f"{_fmt(d['overhead_vs_batch_pct'], 4)}% of the batch", highlight=False)
        if "host_get_per_block_us" in d:
            console.print(f"  = {d['overhead_vs_host_get_block_pct']:.2f}% of one block of the "
                          f"host tier's get in the tier section "
                          f"({d['host_get_per_block_us']:.0f} us per block)", highlight=False)
    rows = report.get("lookup")
    if rows:
        table = Table(title="Chain.lookup, 3 host tiers, every key in the last")
        for col in ("keys", "p50 ms", "min ms", "us/key"):
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(str(r["keys"]), _fmt(r["p50_ms"], 3), _fmt(r["min_ms"], 3),
                          _fmt(r["us_per_key"], 3))
        console.print(table)
    rows = report.get("codec")
    if rows:
        table = Table(title="codec (framing.encode / decode_into, checksum included)")
        for col in ("data", "codec", "level", "shuffle", "ratio", "encode GB/s", "decode GB/s"):
            table.add_column(col, justify="left" if col in ("data", "codec") else "right")
        for r in rows:
            table.add_row(r["data"], r["codec"], str(r["level"]), str(r["shuffle"]),
                          _fmt(r["ratio"], 3),
                          _fmt(r["encode_gbps"], 3), _fmt(r["decode_gbps"], 3))
        console.print(table)


def run_report(settings: BenchSettings, sections: tuple[str, ...],
               progress: Progress) -> dict[str, Any]:
    from kvtier.tierbench.micro import run_codec, run_dispatch, run_lookup

    report: dict[str, Any] = {"machine": machine(), "settings": settings_dict(settings),
                              "sections": list(sections)}
    quick = settings.quick
    lookup_sizes = [1000, 8000] if quick else [1000, 8000, 64000, 1_000_000]
    levels = [1, 3] if quick else [-1, 1, 3, 9]
    if "dispatch" in sections:
        progress.add(2)
    if "lookup" in sections:
        progress.add(len(lookup_sizes))
    if "codec" in sections:
        progress.add(2 * (2 * len(levels) + 1))
    if "tiers" in sections:
        report["tiers"] = run_tiers(settings, progress)
    if "dispatch" in sections:
        report["dispatch"] = d = run_dispatch(settings.block_size, settings.blocks, quick,
                                              progress)
        # against a block's operation as the tier section measured it, cache misses and all
        for row in report.get("tiers", {}).get("results", []):
            if row["tier"] == "host" and row["op"] == "get":
                per_block_us = row["kvtier"]["p50_ms"] * 1e3 / row["blocks_per_call"]
                d["host_get_per_block_us"] = per_block_us
                d["overhead_vs_host_get_block_pct"] = (
                    100 * d["overhead_per_call_us"] / per_block_us)
    if "lookup" in sections:
        report["lookup"] = run_lookup(lookup_sizes, quick, progress)
    if "codec" in sections:
        report["codec"] = run_codec(settings.block_size, levels, quick, progress)
    return report


@click.command("bench")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="Measure the tiers of this chain (default: the built-in backends).")
@click.option("--block-size", default="2MiB", show_default=True, help="Bytes per block.")
@click.option("--blocks", type=click.IntRange(1, 4096), default=16, show_default=True,
              help="Blocks per batched call.")
@click.option("--rounds", type=click.IntRange(1, 10000), default=None,
              help="Timed batches per operation [default: 8, --quick: 2].")
@click.option("--quick", is_flag=True, help="Fewer rounds and smaller sections.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("--backend", "backends", multiple=True, type=click.Choice(BUILTIN),
              help="Without --config: only these built-in backends (repeatable).")
@click.option("--encrypt", is_flag=True,
              help="Without --config: also the fs and object tiers with encrypt on, each beside "
                   "its plaintext twin (a tier with encrypt always gets one).")
@click.option("--aligned", is_flag=True,
              help="Page-aligned blocks and read buffers, as an engine's KV rows are.")
@click.option("--section", "sections", multiple=True, type=click.Choice(SECTIONS),
              help=f"Only these sections (repeatable) [default: {', '.join(SECTIONS)}].")
def bench_command(config_path: str | None, block_size: str, blocks: int, rounds: int | None,
                  quick: bool, as_json: bool, backends: tuple[str, ...], encrypt: bool,
                  aligned: bool, sections: tuple[str, ...]) -> None:
    """Throughput and latency of each tier beside the raw ceiling of its medium.

    Without --config: host; fs in a temporary directory; object on
    $KVTIER_BENCH_S3_ENDPOINT / $KVTIER_BENCH_S3_BUCKET (credentials from
    AWS_*), else on a local SeaweedFS if `weed` is installed; peer against a
    `kvtier serve` started on loopback; host also with verify: false, fs also
    with direct_io: false; with --encrypt, fs and object also encrypted,
    each beside the same tier in plaintext in the same rounds.  Plus pluggy
    dispatch cost, lookup cost over a 3-tier chain and codec ratio and speed.
    """
    try:
        size = parse_size(block_size)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--block-size") from None
    if size < 1:
        raise click.BadParameter("must be at least 1 byte", param_hint="--block-size")
    settings = BenchSettings(block_size=size, blocks=blocks,
                             rounds=rounds if rounds is not None else (2 if quick else 8),
                             quick=quick, backends=backends or BUILTIN, config=config_path,
                             encrypt=encrypt, aligned=aligned)
    progress = Progress(0)
    try:
        report = run_report(settings, sections or SECTIONS, progress)
    finally:
        progress.close()
    if as_json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render(report, output.console())
    if report.get("tiers") and not all(r["verified"] for r in report["tiers"]["results"]):
        click.echo("kvtier bench: some blocks were not stored, not found, or read back "
                   "different from what was written (see the mismatches in --json)", err=True)
        sys.exit(1)
