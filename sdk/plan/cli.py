"""The ``kvtier plan`` command."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict

import click
from rich.markup import escape
from rich.table import Table

from kvtier.config.chain_config import sample_problem
from kvtier.console import console
from kvtier.policies import NAMES as EVICTION_POLICIES

from .below import BELOW_EVICTIONS, BelowPoint, replay_below
from .chart import write_chart
from .checks import (
    BadInput,
    FiniteFloat,
    Size,
    check_endpoint,
    check_unused,
    check_writable,
    given,
    parse_generate,
)
from .fleet import ROUTERS, FleetPoint, replay_fleet
from .report import Plan, default_capacities, describe, make_plan, recommend
from .trace import BLOCK_TOKENS, Trace, generate, read_trace, write_mooncake
from .vllm_events import RecordError, record_events

__all__ = ["plan_command", "record_events_command"]

#: KV bytes per token of Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes.
DEFAULT_BYTES_PER_TOKEN = 131072


class Admission(click.ParamType[tuple[int, float]]):
    """``N`` or ``N:SAMPLE``: a tier's ``admit`` and, optionally, its ``admit_sample``."""

    name = "N[:SAMPLE]"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int, float]:
        if isinstance(value, tuple):
            return value
        count, _, share = str(value).partition(":")
        try:
            n, f = int(count), float(share) if share else 0.0
        except ValueError:
            self.fail(f"expected N or N:SAMPLE (admit: 3, admit_sample: 0.3 is 3:0.3), "
                      f"got {value!r}", param, ctx)
        if n < 1:
            self.fail(f"admit is 1 (every block) or more calls, got {n}", param, ctx)
        problem = sample_problem(n, f)
        if problem is not None:
            self.fail(f"admit_sample: {problem}", param, ctx)
        return n, f


def _load(trace: str | None, generated: str | None, block_tokens: int) -> Trace:
    if generated:
        kind, count, seed = parse_generate(generated)
        try:
            return generate(kind, count, seed, block_tokens)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--generate") from None
    if not trace:
        raise click.UsageError("give a TRACE file or --generate KIND:REQUESTS[:SEED]")
    try:
        loaded = read_trace(trace, block_tokens)
    except OSError as exc:
        raise BadInput(f"{trace}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if not loaded.references:
        raise BadInput(f"{trace}: no requests with blocks to replay")
    return loaded


def _ram_blocks(ram: int | None, trace: Trace, block_bytes: int) -> int | None:
    """The RAM budget in blocks of the trace, never above the budget once scaled back."""
    if ram is None:
        return None
    full = ram // block_bytes
    if full < 1:
        raise click.BadParameter(f"{ram:,} bytes is less than one block of {block_bytes:,} "
                                 f"bytes ({trace.block_tokens} tokens x --bytes-per-token)",
                                 param_hint="--ram")
    blocks = int(full * trace.sample)  # down: scaled back, the plan's RAM stays within it
    if blocks < 1:
        raise click.BadParameter(f"{full:,} blocks is less than one block of the trace, "
                                 f"which holds a sample of {trace.sample:g} of the traffic",
                                 param_hint="--ram")
    return blocks


@click.command("plan")
@click.argument("trace", required=False, type=click.Path(dir_okay=False, exists=True))
@click.option("--generate", "generated", metavar="KIND:REQUESTS[:SEED]",
              help="Replay a generated trace: prompts, sessions, documents or scan.")
@click.option("--save-trace", type=click.Path(dir_okay=False),
              help="Write the trace as Mooncake JSONL.")
@click.option("--policy", "policies", multiple=True, type=click.Choice(EVICTION_POLICIES),
              help="Policies to replay (repeat; default: all of the host tier's).")
@click.option("--capacity", "capacities", multiple=True, type=click.IntRange(min=1),
              help="Capacity in blocks of the trace (repeat; default: 8 from 1% to 100% of "
                   "unique blocks).")
@click.option("--ram", type=Size(), help="RAM budget for the recommended chain, e.g. 64GiB.")
@click.option("--block-tokens", default=BLOCK_TOKENS, show_default=True,
              type=click.IntRange(min=1),
              help="Tokens per block of a Mooncake trace or --generate (a recording and an "
                   "event log name their own).")
@click.option("--bytes-per-token", default=DEFAULT_BYTES_PER_TOKEN, show_default=True,
              type=click.IntRange(min=1), help="KV bytes per token (default: Llama-3.1-8B, bf16).")
@click.option("--belady/--no-belady", default=True, show_default=True,
              help="Compute Belady's bound at each capacity.")
@click.option("--below", type=click.IntRange(min=1), metavar="BLOCKS",
              help="Also replay each capacity as RAM over a tier of BLOCKS below it (LRU, "
                   "see --below-eviction), with the chain's admission (see --admit).")
@click.option("--below-eviction", "below_evictions", multiple=True,
              type=click.Choice(BELOW_EVICTIONS),
              help="How the tiers below RAM evict in the --below and --engines replays: lru "
                   "(the fs tier's default) or s3fifo (the fs and object tiers' eviction: "
                   "s3fifo). Repeat to compare both on the same rows; the recommended fs tier "
                   "gets eviction: s3fifo where its --below replays served more prefix hits "
                   "than lru's (default: lru, not named in the output).")
@click.option("--admit", "admits", multiple=True, type=Admission(),
              help="admit: N values to compare with --below, each with an admit_sample as "
                   "N:SAMPLE (repeat; default: 1 and 3).")
@click.option("--write", type=click.Choice(["back", "through"]),
              help="How the tiers below RAM are written (default: back with --below, "
                   "through with --engines).")
@click.option("--engines", type=click.IntRange(min=1), metavar="N",
              help="Replay across N engines, each with its RAM (--capacity or --ram) and "
                   "local tier (--below), sharing one pool (--pool).")
@click.option("--router", type=click.Choice(ROUTERS), default="round-robin", show_default=True,
              help="With --engines: how requests are sent to engines.")
@click.option("--balance", type=FiniteFloat(), default=0.0, metavar="FACTOR",
              help="With --engines: an engine that has served FACTOR times its share of the "
                   "requests so far is skipped by sticky and prefix routers (0: no bound).")
@click.option("--pool", "pools", multiple=True, type=click.IntRange(min=0), metavar="BLOCKS",
              help="With --engines: the shared pool's capacity in blocks (repeat; default: 8 "
                   "from 1% to 100% of unique blocks; 0: no pool).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--chart", type=click.Path(dir_okay=False), help="Write the curves as a PNG.")
def plan_command(
    trace: str | None, generated: str | None, save_trace: str | None, policies: tuple[str, ...],
    capacities: tuple[int, ...], ram: int | None, block_tokens: int, bytes_per_token: int,
    belady: bool, below: int | None, below_evictions: tuple[str, ...],
    admits: tuple[tuple[int, float], ...], write: str | None, engines: int | None, router: str,
    balance: float, pools: tuple[int, ...], as_json: bool, chart: str | None,
) -> None:
    """Replay TRACE through kvtier's eviction policies at many capacities: what each byte buys.

    TRACE is Mooncake JSONL (hash_ids of 512-token blocks), a chain's
    recording (the record: option) or a vLLM KV-event log (kvtier
    record-events).  Reports each policy's prefix hit ratio,
    the infinite-cache ceiling, Belady's bound, prefill tokens saved, blocks
    written below RAM, and a chain as YAML.
    """
    ctx = click.get_current_context()
    check_writable("--save-trace", save_trace)
    check_writable("--chart", chart)
    check_unused(ctx)
    if 0 < balance < 1:
        raise click.BadParameter("0 (no bound) or at least 1", param_hint="--balance")
    loaded = _load(trace, generated, block_tokens)
    if given(ctx, "block_tokens") and loaded.block_tokens != block_tokens:
        raise BadInput(f"--block-tokens has no effect: {trace} names its own "
                       f"({loaded.block_tokens} tokens a block)")
    block_bytes = loaded.block_tokens * bytes_per_token
    ram_blocks = _ram_blocks(ram, loaded, block_bytes)
    if save_trace:
        try:
            write_mooncake(loaded, save_trace)
        except OSError as exc:
            raise click.BadParameter(str(exc), param_hint="--save-trace") from None
    if engines:
        fleet_caps = list(capacities) or [ram_blocks or max(1, loaded.unique_blocks // 100)]
        _fleet(loaded, (engines, router, balance), policies or ("lru",), fleet_caps, below or 0,
               list(pools) or default_capacities(loaded.unique_blocks), write or "through",
               block_bytes, as_json, below_evictions)
        return
    write = write or "back"
    caps = list(capacities) or default_capacities(loaded.unique_blocks)
    started = time.perf_counter()
    plan = make_plan(loaded, policies or EVICTION_POLICIES, caps, block_bytes, belady, ram_blocks)
    seconds = time.perf_counter() - started
    policy = max(plan.curves, key=lambda name: sum(p.prefix_hits for p in plan.curves[name]))
    rows = [replay_below(loaded, policy, cap, below, write, n, low, share)
            for cap in plan.capacities for n, share in (admits or ((1, 0.0), (3, 0.0)))
            for low in (below_evictions or ("lru",))] if below else []
    plan.below = rows
    if as_json:
        click.echo(json.dumps({**plan.to_json(), "seconds": round(seconds, 3),
                               "below": [_named({**asdict(r), "ram_full": plan.scale(r.ram),
                                                  "below_full": plan.scale(r.below),
                                                  "prefix_ratio": r.prefix_ratio,
                                                  "never_read_share": r.never_read_share},
                                                below_evictions) for r in rows]}, indent=1))
    else:
        _print(plan, seconds)
        if rows:
            _print_below(rows, policy, bool(below_evictions), plan.scale)
    if chart:
        try:
            why = write_chart(plan, chart)
        except OSError as exc:  # checked before the replay; the folder went away since
            raise click.ClickException(f"--chart: {exc}") from None
        click.echo(why or f"chart: {chart}", err=bool(why) or as_json)  # stdout: JSON only


def _named(row: dict[str, object], below_evictions: tuple[str, ...]) -> dict[str, object]:
    """A row of JSON output: its below_eviction only where --below-eviction was given."""
    if not below_evictions:
        row.pop("below_eviction", None)
    return row


def _print(plan: object, seconds: float) -> None:
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


def _print_below(rows: list[BelowPoint], policy: str, named: bool,
                 scale: Callable[[int], int]) -> None:
    table = Table(title=f"RAM ({policy}) over {scale(rows[0].below):,} blocks below, "
                        f"write: {rows[0].write}, by admit (blocks of the full traffic)")
    for column in ("RAM blocks", "admit", *(["below evicts"] if named else []),
                   "prefix hit ratio", "from RAM", "from below", "written below",
                   "never read below"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(f"{scale(r.ram):,}", r.admission, *([r.below_eviction] if named else []),
                      f"{r.prefix_ratio:.1%}", f"{r.from_ram:,}", f"{r.from_below:,}",
                      f"{r.written_below:,}", f"{r.never_read:,} ({r.never_read_share:.0%})")
    console().print(table)


def _fleet(
    trace: Trace, routing: tuple[int, str, float], policies: tuple[str, ...], rams: list[int],
    local: int, pools: list[int], write: str, block_bytes: int, as_json: bool,
    below_evictions: tuple[str, ...] = (),
) -> None:
    engines, router, balance = routing
    started = time.perf_counter()
    points = [replay_fleet(trace, engines, router, policy, ram, local, pool, write, balance, low)
              for low in (below_evictions or ("lru",)) for policy in policies
              for ram in sorted(set(rams)) for pool in sorted(set(pools))]
    seconds = time.perf_counter() - started
    if as_json:
        click.echo(json.dumps({"trace": describe(trace), "block_bytes": block_bytes,
                               "seconds": round(seconds, 3),
                               "fleet": [_named(p.to_json(), below_evictions) for p in points]},
                              indent=1))
        return
    out = console()
    out.print(escape(f"{trace.source}: {len(trace.requests):,} requests, "
                     f"{trace.references:,} block references, {engines} engines, "
                     f"router {router}{f' (balance {balance:g})' if balance else ''}, "
                     f"write {write}; replayed in {seconds:.1f} s"))
    scale = 1 / (trace.sample or 1.0)
    for group in range(0, len(points), len(set(pools))):
        rows = points[group:group + len(set(pools))]
        head = rows[0]
        lows = f" ({head.below_eviction})" if below_evictions else ""
        table = Table(title=f"each engine: RAM {head.ram * scale:,.0f} blocks ({head.eviction})"
                            f", local {head.local * scale:,.0f}{lows}; by shared pool{lows}")
        for column in ("pool blocks", "pool bytes", "prefix hit ratio", "from RAM",
                       "from local", "from pool", "tokens saved", "written local (never read)",
                       "written pool (never read)"):
            table.add_column(column, justify="right")
        for p in rows:
            t = p.total
            table.add_row(f"{p.pool * scale:,.0f}", _gib(round(p.pool * scale) * block_bytes),
                          f"{t.prefix_ratio:.1%}", f"{t.from_ram:,}", f"{t.from_local:,}",
                          f"{t.from_pool:,}", f"{t.prefix_tokens:,}",
                          _unread(t.written_local, t.never_read_local),
                          _unread(t.written_pool, t.never_read_pool))
        out.print(table)
        _print_engines(rows[-1], scale)


def _unread(written: int, never_read: int) -> str:
    """Writes below, with the share of them no read used: ``1,234 (72%)``."""
    return f"{written:,} ({never_read / written:.0%})" if written else "0"


def _print_engines(point: FleetPoint, scale: float) -> None:
    table = Table(title=f"per engine, pool {point.pool * scale:,.0f} blocks")
    for column in ("engine", "requests", "prefix hit ratio", "from RAM", "from local",
                   "from pool", "written local", "written pool"):
        table.add_column(column, justify="right")
    for i, e in enumerate(point.per_engine):
        table.add_row(str(i), f"{e.requests:,}", f"{e.prefix_ratio:.1%}", f"{e.from_ram:,}",
                      f"{e.from_local:,}", f"{e.from_pool:,}", f"{e.written_local:,}",
                      f"{e.written_pool:,}")
    console().print(table)
    busiest = max(e.requests for e in point.per_engine)
    if point.engines > 1 and busiest > 2 * point.total.requests / point.engines:
        console().print(f"one engine served {busiest:,} of {point.total.requests:,} requests, "
                        "over twice its share: the router's affinity concentrates the load "
                        "(--balance bounds it)")


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):,.1f} GiB"


@click.command("record-events")
@click.option("--endpoint", default="tcp://127.0.0.1:5557", show_default=True,
              help="vLLM's KV-event publisher (its kv_events_config endpoint).")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="JSONL file the batches are appended to.")
@click.option("--topic", default="", help="The publisher's topic.")
@click.option("--replay-endpoint", help="vLLM's replay endpoint: fetch the batches it buffers.")
@click.option("--bind", is_flag=True, help="Bind the endpoint (vLLM set to connect to it).")
@click.option("--batches", type=click.IntRange(min=1), help="Stop after this many batches.")
@click.option("--seconds", type=FiniteFloat(), help="Stop after this long.")
def record_events_command(endpoint: str, out: str, topic: str, replay_endpoint: str | None,
                          bind: bool, batches: int | None, seconds: float | None) -> None:
    """Record vLLM's KV-cache events as JSONL that kvtier plan reads (block hashes, no prompts).

    Runs until --batches, --seconds or Ctrl-C.
    """
    check_endpoint("--endpoint", endpoint)
    check_endpoint("--replay-endpoint", replay_endpoint)
    check_writable("--out", out)
    try:
        stats = record_events(endpoint, out, topic=topic, replay=replay_endpoint, bind=bind,
                              batches=batches, seconds=seconds)
    except ImportError:
        raise click.ClickException("pyzmq is not installed (pip install pyzmq)") from None
    except RecordError as exc:
        raise BadInput(str(exc)) from None
    click.echo(f"{out}: {stats.batches:,} batches, {stats.events:,} events; "
               f"{stats.skipped:,} undecodable, {stats.missed:,} missed (sequence gaps)")
