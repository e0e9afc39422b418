"""The ``kvtier plan`` command."""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import click
from rich.markup import escape
from rich.table import Table

from kvtier.backends.eviction import EVICTION_POLICIES
from kvtier.plugins.options import parse_size

from .below import BelowPoint, replay_below
from .chart import write_chart
from .report import default_capacities, make_plan, recommend
from .trace import BLOCK_TOKENS, Trace, generate, read_trace, write_mooncake

__all__ = ["plan_command"]

#: KV bytes per token of Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes.
DEFAULT_BYTES_PER_TOKEN = 131072


def _load(trace: str | None, generated: str | None, block_tokens: int) -> Trace:
    if generated:
        kind, _, rest = generated.partition(":")
        count, _, seed = rest.partition(":")
        try:
            return generate(kind, int(count or 1000), int(seed or 0), block_tokens)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--generate") from None
    if not trace:
        raise click.UsageError("give a TRACE file or --generate KIND:REQUESTS[:SEED]")
    try:
        return read_trace(trace, block_tokens)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


@click.command("plan")
@click.argument("trace", required=False, type=click.Path(dir_okay=False, exists=True))
@click.option("--generate", "generated", metavar="KIND:REQUESTS[:SEED]",
              help="Replay a generated trace: prompts, sessions, documents or scan.")
@click.option("--save-trace", type=click.Path(dir_okay=False),
              help="Write the trace as Mooncake JSONL.")
@click.option("--policy", "policies", multiple=True, type=click.Choice(EVICTION_POLICIES),
              help="Policies to replay (repeat; default: all of the host tier's).")
@click.option("--capacity", "capacities", multiple=True, type=int,
              help="Capacity in blocks (repeat; default: 8 from 1% to 100% of unique blocks).")
@click.option("--ram", help="RAM budget for the recommended chain, e.g. 64GiB.")
@click.option("--block-tokens", default=BLOCK_TOKENS, show_default=True,
              help="Tokens per block (Mooncake traces: 512).")
@click.option("--bytes-per-token", default=DEFAULT_BYTES_PER_TOKEN, show_default=True,
              help="KV bytes per token (default: Llama-3.1-8B, bf16).")
@click.option("--belady/--no-belady", default=True, show_default=True,
              help="Compute Belady's bound at each capacity.")
@click.option("--below", type=click.IntRange(min=1), metavar="BLOCKS",
              help="Also replay each capacity as RAM over an LRU tier of BLOCKS below it, "
                   "with the chain's admission (see --admit).")
@click.option("--admit", "admits", multiple=True, type=click.IntRange(min=1),
              help="admit: N values to compare with --below (repeat; default: 1 and 3).")
@click.option("--write", type=click.Choice(["back", "through"]), default="back",
              show_default=True, help="How the tier of --below is written.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--chart", type=click.Path(dir_okay=False), help="Write the curves as a PNG.")
def plan_command(
    trace: str | None, generated: str | None, save_trace: str | None, policies: tuple[str, ...],
    capacities: tuple[int, ...], ram: str | None, block_tokens: int, bytes_per_token: int,
    belady: bool, below: int | None, admits: tuple[int, ...], write: str, as_json: bool,
    chart: str | None,
) -> None:
    """Replay TRACE through kvtier's eviction policies at many capacities: what each byte buys.

    TRACE is Mooncake JSONL (hash_ids of 512-token blocks) or a chain's
    recording (the record: option).  Reports each policy's prefix hit ratio,
    the infinite-cache ceiling, Belady's bound, prefill tokens saved, blocks
    written below RAM, and a chain as YAML.
    """
    loaded = _load(trace, generated, block_tokens)
    if save_trace:
        write_mooncake(loaded, save_trace)
    block_bytes = loaded.block_tokens * bytes_per_token
    ram_blocks = None
    if ram:
        ram_blocks = max(1, round(parse_size(ram) // block_bytes * loaded.sample))
    caps = list(capacities) or default_capacities(loaded.unique_blocks)
    started = time.perf_counter()
    plan = make_plan(loaded, policies or EVICTION_POLICIES, caps, block_bytes, belady, ram_blocks)
    seconds = time.perf_counter() - started
    policy = max(plan.curves, key=lambda name: sum(p.prefix_hits for p in plan.curves[name]))
    rows = [replay_below(loaded, policy, cap, below, write, n)
            for cap in plan.capacities for n in (admits or (1, 3))] if below else []
    if as_json:
        click.echo(json.dumps({**plan.to_json(), "seconds": round(seconds, 3),
                               "below": [{**asdict(r), "prefix_ratio": r.prefix_ratio}
                                         for r in rows]}, indent=1))
    else:
        _print(plan, seconds)
        if rows:
            _print_below(rows, policy)
    if chart:
        why = write_chart(plan, chart)
        click.echo(why or f"chart: {chart}", err=bool(why))


def _print(plan: object, seconds: float) -> None:
    from kvtier.cli.output import console

    from .report import Plan

    assert isinstance(plan, Plan)
    info, refs = plan.trace, plan.ceiling.references
    out = console()
    out.print(escape(
        f"{info['source']}: {info['requests']:,} requests, {refs:,} block references, "
        f"{info['unique_blocks']:,} unique blocks, sample {info['sample']:g}; "
        f"replayed in {seconds:.1f} s"))
    table = Table(title="prefix hit ratio by capacity (blocks of the full traffic)")
    table.add_column("capacity", justify="right")
    table.add_column("bytes", justify="right")
    for name in plan.curves:
        table.add_column(name, justify="right")
    if plan.belady:
        table.add_column("Belady (blocks)", justify="right")
    table.add_column("tokens saved (best)", justify="right")
    table.add_column("written below: through / back (best)", justify="right")
    for i, cap in enumerate(plan.capacities):
        points = {name: pts[i] for name, pts in plan.curves.items()}
        best = max(points.values(), key=lambda p: p.prefix_hits)
        row = [f"{plan.scale(cap):,}", _gib(plan.scale(cap) * plan.block_bytes)]
        row += [f"{p.prefix_ratio:.1%}" for p in points.values()]
        if plan.belady:
            row.append(f"{plan.belady[i] / refs:.1%}" if refs else "-")
        row += [f"{best.prefix_tokens:,}", f"{best.puts:,} / {best.evictions:,}"]
        table.add_row(*row)
    ceiling = plan.ceiling
    table.add_row("infinite", "-", *[f"{ceiling.prefix_ratio:.1%}"] * len(plan.curves),
                  *([f"{ceiling.block_hits / refs:.1%}"] if plan.belady and refs else []),
                  f"{ceiling.prefix_tokens:,}", f"{ceiling.puts:,} / 0")
    out.print(table)
    out.print("recommended chain:")
    out.print(escape(recommend(plan)), highlight=False)


def _print_below(rows: list[BelowPoint], policy: str) -> None:
    from kvtier.cli.output import console

    table = Table(title=f"RAM ({policy}) over {rows[0].below:,} blocks below, "
                        f"write: {rows[0].write}, by admit")
    for column in ("RAM blocks", "admit", "prefix hit ratio", "from RAM", "from below",
                   "written below"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(f"{r.ram:,}", str(r.admit), f"{r.prefix_ratio:.1%}", f"{r.from_ram:,}",
                      f"{r.from_below:,}", f"{r.written_below:,}")
    console().print(table)


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):,.1f} GiB"
