"""``kvtier inspect``, ``kvtier scrub`` and ``kvtier purge``: a chain's stores for operators.

Each takes the chain file an engine uses, ``--tier NAME`` (repeatable) to
pick tiers, prints tables, and with ``--json`` one JSON document on stdout
instead.  Exit status: 0 done, 1 ``scrub`` found corrupt or unreadable
blocks or a purge was not confirmed, 2 the file, a tier or the arguments are wrong,
3 a tier's store could not be opened (the other tiers were done and reported).
``inspect`` and ``scrub`` without ``--repair`` write nothing.  What they
do is :mod:`kvtier.cli.operate`.
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from kvtier.cli.operate import (
    OperatorStore,
    RateLimit,
    inspect_store,
    open_stores,
    purge_plan,
    remove,
    scrub_store,
    still_held,
    tenant_keeping,
    tenant_totals,
)
from kvtier.config.chain_config import load_config
from kvtier.config.units import format_size, parse_duration, parse_size
from kvtier.console import console
from kvtier.observe.metrics import read_sizing
from kvtier.plugins.registry import default_registry
from kvtier.spec import KvtierError, ScanEntry

__all__ = ["inspect_command", "purge_command", "scrub_command"]

_NAMESPACE_RE = re.compile(r"^[0-9a-f]{32}$")
#: The exit status when a tier's store could not be opened: its blocks were not looked at.
FAILED_EXIT = 3


def _fail(message: str) -> None:
    console(stderr=True).print(f"[bold red]error:[/] {escape(message)}")
    sys.exit(2)


@contextmanager
def _stores(config_file: str, tiers: Sequence[str],
            read_only: bool = False) -> Iterator[list[OperatorStore]]:
    try:
        config = load_config(config_file)
        stores = open_stores(config, default_registry(), tiers, read_only)
    except KvtierError as exc:
        _fail(str(exc))
        raise AssertionError("unreachable") from None
    try:
        yield stores
    finally:
        for store in stores:
            store.close()


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")


def _model(description: dict[str, Any] | None) -> str:
    return "?" if description is None else str(description["model"])


def _emit(as_json: bool, document: dict[str, Any], tables: Callable[[Console], None]) -> None:
    failed = [row for row in document["tiers"] if "failed" in row]
    document["failed"] = len(failed)
    if as_json:
        click.echo(json.dumps(document, indent=2, sort_keys=True))
    else:
        tables(console())
    if failed:  # on stderr too: what was not looked at must not pass unseen
        names = ", ".join(repr(row["tier"]) for row in failed)
        console(stderr=True).print(f"[bold red]error:[/] {escape(names)}: could not be opened, "
                                   "so not looked at" + ("" if as_json else " (see above)"))


def _not_done(row: dict[str, Any], console: Console) -> bool:
    """Print the line of a tier skipped or failed; whether it was one."""
    title = f"tier {row['tier']} ({row['backend']})"
    if "failed" in row:
        console.print(f"{escape(title)}: [bold red]FAILED[/], {escape(row['failed'])}")
    elif "skipped" in row:
        console.print(f"{escape(title)}: skipped, {escape(row['skipped'])}")
    return "failed" in row or "skipped" in row


def _status(store: OperatorStore, row: dict[str, Any]) -> bool:
    """Note in ``row`` why ``store`` is skipped or failed; whether it is one."""
    if store.failed is not None:
        row["failed"] = store.failed
    elif store.skipped is not None:
        row["skipped"] = store.skipped
    return store.failed is not None or store.skipped is not None


def _config_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--json", "as_json", is_flag=True,
                      help="Print one JSON document instead of tables.")(fn)
    fn = click.option("--tier", "tiers", multiple=True, metavar="NAME",
                      help="Only this tier (repeatable); default: every tier.")(fn)
    return click.argument("config_file", metavar="CONFIG",
                          type=click.Path(exists=True, dir_okay=False))(fn)


# -------------------------------------------------------------------------
# inspect
# -------------------------------------------------------------------------


@click.command("inspect")
@_config_options
@click.option("--sample", type=click.IntRange(min=0), default=64, show_default=True,
              help="Block headers read per namespace for the codec mix.")
@click.option("--metrics", "metrics", multiple=True, metavar="URL",
              help="A serving chain's Prometheus endpoint (repeatable): show its tiers' "
                   "online sizing, RAM tiers included.")
@click.option("--tenant", "tenants", multiple=True, metavar="NAME",
              help="Only this tenant's namespaces and figures (repeatable).")
def inspect_command(config_file: str, tiers: tuple[str, ...], as_json: bool, sample: int,
                    metrics: tuple[str, ...], tenants: tuple[str, ...]) -> None:
    """What each tier of CONFIG holds: namespaces (model, dtype, ...), blocks, bytes, codecs,
    and per tenant (named by the blocks' headers) its blocks and bytes.

    With --metrics, also the hit ratio each tier's serving process estimates at
    0.5x, 1x, 2x and 4x its capacity (online sizing, docs/sizing.md).
    """
    live = _live_sizing(metrics)
    report: list[dict[str, Any]] = []
    with _stores(config_file, tiers, read_only=True) as stores:
        for store in stores:
            row: dict[str, Any] = {"tier": store.name, "backend": store.config.backend}
            if metrics:
                row["sizing"] = [{"metrics": url, "namespace": ns, "hit_ratio": ratios}
                                 for url, found in live for (tier, ns), ratios in found.items()
                                 if tier == store.name]
            if not _status(store, row):
                try:
                    summaries, descriptors = inspect_store(store, sample)
                except KvtierError as exc:
                    _fail(f"tier {store.name!r}: {exc}")
                    return
                if tenants:
                    summaries = [s for s in summaries if s.tenant in tenants]
                row["namespaces"] = [s.as_json() for s in summaries]
                row["tenants"] = tenant_totals(summaries, tenant_keeping(store))
                row["descriptors"] = descriptors
                read = [(s.sampled, s.block_load_s) for s in summaries if s.sampled]
                row["block_load_s"] = (sum(n * t for n, t in read) / sum(n for n, _ in read)
                                       if read else None)
            report.append(row)
    document = {"config": config_file, "tiers": report}
    _emit(as_json, document, lambda c: _inspect_tables(c, report))
    sys.exit(FAILED_EXIT if document["failed"] else 0)


def _live_sizing(urls: Sequence[str]) -> list[tuple[str, dict[tuple[str, str], dict[str, float]]]]:
    """Online sizing per (tier, namespace) read from each Prometheus endpoint in ``urls``."""
    live = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                text = answer.read().decode("utf-8", "replace")
        except (OSError, ValueError) as exc:
            _fail(f"--metrics {url}: {exc}")
        live.append((url, read_sizing(text)))
    return live


def _sizing_lines(console: Console, row: dict[str, Any]) -> None:
    for live in row.get("sizing", ()):
        ratios = ", ".join(f"{scale} {ratio:.1%}" for scale, ratio in
                           sorted(live["hit_ratio"].items(), key=lambda i: float(i[0][:-1])))
        console.print(f"online sizing, {escape(live['metrics'])}, namespace "
                      f"{live['namespace'][:12]}: hit ratio at {ratios} of the capacity")
    if "sizing" in row and not row["sizing"]:
        console.print("online sizing: none exported for this tier (no capacity, or "
                      "sizing_sample: 0)")


def _inspect_tables(console: Console, report: list[dict[str, Any]]) -> None:
    for row in report:
        title = f"tier {row['tier']} ({row['backend']})"
        if _not_done(row, console):
            _sizing_lines(console, row)
            continue
        table = Table(title=title, title_justify="left")
        table.add_column("namespace", no_wrap=True)
        table.add_column("model", overflow="fold")
        table.add_column("kv (dtype, tokens/block, layout)", overflow="fold")
        for column in ("blocks", "bytes"):
            table.add_column(column, justify="right", no_wrap=True)
        for column in ("oldest", "newest"):
            table.add_column(column, no_wrap=True)
        table.add_column("codecs", overflow="fold")
        for ns in row["namespaces"]:
            d = ns["description"] or {}
            kv = ", ".join(str(x) for x in (d.get("dtype"), d.get("tokens_per_block"),
                                            d.get("kv_layout"), d.get("parallel_layout")) if x)
            codecs = ", ".join(f"{k} {v}" for k, v in sorted(ns["codecs"].items()))
            if ns["sampled"] < ns["blocks"] and codecs:
                codecs += f" (of {ns['sampled']} read)"
            table.add_row(ns["namespace"][:12], escape(_model(ns["description"])),
                          escape(kv or "-"), str(ns["blocks"]), format_size(ns["bytes"]),
                          _when(ns["oldest"]), _when(ns["newest"]), codecs or "-")
        console.print(table)
        blocks = sum(ns["blocks"] for ns in row["namespaces"])
        size = sum(ns["bytes"] for ns in row["namespaces"])
        console.print(f"{len(row['namespaces'])} namespace(s), {blocks} block(s), "
                      f"{format_size(size)}; {row['descriptors']} namespace descriptor(s); "
                      "times in UTC")
        if row["block_load_s"] is not None:
            console.print(f"expected load of a usual block: {row['block_load_s'] * 1e3:.3g} ms "
                          "(0.9 quantile, from the blocks read here)")
        _tenant_table(console, row)
        _sizing_lines(console, row)


def _tenant_table(console: Console, row: dict[str, Any]) -> None:
    if not row["tenants"]:
        return
    table = Table(title=f"tier {row['tier']}: per tenant", title_justify="left")
    table.add_column("tenant", overflow="fold")
    for column in ("namespaces", "blocks", "bytes", "kept", "keep refused"):
        table.add_column(column, justify="right", no_wrap=True)
    for t in row["tenants"]:  # '-': the tier counts no marks per tenant
        kept = "-" if t["kept_bytes"] is None else format_size(t["kept_bytes"])
        refused = "-" if t["keep_refused"] is None else str(t["keep_refused"])
        table.add_row(escape(t["tenant"] or "(unknown: no header read)"), str(t["namespaces"]),
                      str(t["blocks"]), format_size(t["bytes"]), kept, refused)
    console.print(table)


# -------------------------------------------------------------------------
# scrub
# -------------------------------------------------------------------------


@click.command("scrub")
@_config_options
@click.option("--repair", is_flag=True, help="Remove the corrupt blocks found.")
@click.option("--max-rate", metavar="BYTES", default=None,
              help="Read at most this many bytes per second, e.g. 200MiB (to run beside serving).")
def scrub_command(config_file: str, tiers: tuple[str, ...], as_json: bool, repair: bool,
                  max_rate: str | None) -> None:
    """Read and verify every block of CONFIG's tiers (header, namespace, key, checksum).

    Exits 1 when any block is corrupt (also with --repair, which removes them) or
    unreadable (a fault of that block's file, such as EACCES or EIO: listed, never
    removed, and the scrub goes on).
    """
    try:
        rate = None if max_rate is None else float(parse_size(max_rate))
    except ValueError as exc:
        _fail(f"--max-rate: {exc}")
        return
    if rate is not None and rate <= 0:
        _fail("--max-rate must be more than 0 bytes per second")
    report: list[dict[str, Any]] = []
    with _stores(config_file, tiers, read_only=not repair) as stores:
        for store in stores:
            report.append(_scrub_one(store, repair, rate))
    corrupt = sum(len(r.get("corrupt", [])) for r in report)
    unreadable = sum(len(r.get("unreadable", [])) for r in report)
    document = {"config": config_file, "tiers": report, "corrupt": corrupt,
                "unreadable": unreadable, "repair": repair}
    _emit(as_json, document, lambda c: _scrub_tables(c, report, repair))
    sys.exit(FAILED_EXIT if document["failed"] else 1 if corrupt or unreadable else 0)


def _scrub_one(store: OperatorStore, repair: bool, rate: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {"tier": store.name, "backend": store.config.backend}
    if _status(store, row):
        return row
    try:
        entries = store.entries()
        columns = (TextColumn(f"scrub {store.name}"), BarColumn(), DownloadColumn(),
                   TimeRemainingColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("scrub", total=sum(e.size for e in entries))
            result = scrub_store(store, entries, repair=repair, limit=RateLimit(rate),
                                 progress=lambda n: bar.advance(task, n))
    except KvtierError as exc:
        _fail(f"tier {store.name!r}: {exc}")
        raise AssertionError("unreachable") from None
    row.update(checked=result.checked, bytes=result.bytes, vanished=result.vanished,
               corrupt=[c.as_json() for c in result.corrupt],
               unreadable=[{"namespace": e.namespace, "key": e.key.hex(), "size": e.size}
                           for e in result.unreadable])
    return row


def _scrub_tables(console: Console, report: list[dict[str, Any]], repair: bool) -> None:
    for row in report:
        title = f"tier {row['tier']} ({row['backend']})"
        if _not_done(row, console):
            continue
        console.print(f"{escape(title)}: {row['checked']} block(s) checked, "
                      f"{format_size(row['bytes'])}, {len(row['corrupt'])} corrupt"
                      + (f", {row['vanished']} gone during the scrub" if row["vanished"] else "")
                      + (f", {len(row['unreadable'])} unreadable" if row["unreadable"] else ""))
        for u in row["unreadable"]:
            console.print(f"  unreadable (kept): {u['namespace'][:12]} {u['key']} "
                          f"({u['size']} bytes); check the file's permissions and the device")
        if not row["corrupt"]:
            continue
        table = Table(title=f"corrupt blocks in {row['tier']}", title_justify="left")
        for column in ("namespace", "key", "bytes", "problem", "removed"):
            table.add_column(column, overflow="fold")
        for c in row["corrupt"]:
            table.add_row(c["namespace"][:12], c["key"], str(c["size"]), escape(c["reason"]),
                          "yes" if c["removed"] else "no")
        console.print(table)
    if not repair and any(row.get("corrupt") for row in report):
        console.print("run again with --repair to remove them")


# -------------------------------------------------------------------------
# purge
# -------------------------------------------------------------------------


@click.command("purge")
@_config_options
@click.option("--model", default=None, help="Blocks of namespaces of this model.")
@click.option("--namespace", default=None, metavar="HEX",
              help="Blocks of this namespace (32 hex digits).")
@click.option("--older-than", default=None, metavar="AGE",
              help="Blocks stored longer ago than this, e.g. 7d, 12h.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def purge_command(config_file: str, tiers: tuple[str, ...], as_json: bool, model: str | None,
                  namespace: str | None, older_than: str | None, yes: bool) -> None:
    """Delete the blocks that match every selector given; report the bytes freed."""
    if model is None and namespace is None and older_than is None:
        _fail("purge needs a selector: --model NAME, --namespace HEX or --older-than AGE "
              "(it never deletes everything)")
    if namespace is not None and not _NAMESPACE_RE.match(namespace):
        _fail(f"--namespace: expected 32 lowercase hex digits, got {namespace!r}")
    try:
        age = None if older_than is None else parse_duration(older_than)
    except ValueError as exc:
        _fail(f"--older-than: {exc}")
        return
    now = time.time()
    with _stores(config_file, tiers) as stores:
        plans: list[tuple[OperatorStore, list[ScanEntry], int, dict[str, Any],
                          dict[str, int]]] = []
        for store in stores:
            if store.skipped is not None or store.failed is not None:
                plans.append((store, [], 0, {}, {}))
                continue
            try:
                plans.append((store, *purge_plan(store, model=model, namespace=namespace,
                                                 older_than=age, now=now)))
            except KvtierError as exc:
                _fail(f"tier {store.name!r}: {exc}")
        blocks = sum(len(p[1]) for p in plans)
        size = sum(e.size for p in plans for e in p[1])
        if blocks and not yes:
            where = ", ".join(p[0].name for p in plans if p[1])
            if not click.confirm(f"delete {blocks} block(s), {format_size(size)}, from {where}?",
                                 err=True):
                click.echo("nothing deleted", err=True)
                sys.exit(1)
        report = [_purge_one(*plan, whole=age is None) for plan in plans]
    document = {"config": config_file, "tiers": report,
                "removed_blocks": sum(r.get("removed_blocks", 0) for r in report),
                "freed_bytes": sum(r.get("freed_bytes", 0) for r in report)}
    _emit(as_json, document, lambda c: _purge_tables(c, report, document, model))
    # blocks it matched and could not remove, or that --model could not judge: not done
    left = any(r.get("kept") or r.get("undescribed") for r in report)
    sys.exit(FAILED_EXIT if document["failed"] else 1 if left else 0)


def _purge_one(store: OperatorStore, matched: list[ScanEntry], undated: int,
               descriptors: dict[str, Any], undescribed: dict[str, int],
               whole: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"tier": store.name, "backend": store.config.backend}
    if _status(store, row):
        return row
    try:
        removed, freed = remove(store, matched, whole_namespaces=whole)
        # an evict that answered False: gone already, or still held (a fault of its file)
        kept = still_held(store, matched) if removed < len(matched) else []
    except KvtierError as exc:
        _fail(f"tier {store.name!r}: {exc}")
        raise AssertionError("unreachable") from None
    per_ns: dict[str, dict[str, Any]] = {}
    for entry in matched:
        ns = per_ns.setdefault(entry.namespace, {
            "namespace": entry.namespace, "model": _model(descriptors.get(entry.namespace)),
            "blocks": 0, "bytes": 0})
        ns["blocks"] += 1
        ns["bytes"] += entry.size
    row.update(namespaces=list(per_ns.values()), removed_blocks=removed, freed_bytes=freed,
               undated=undated, undescribed=undescribed,
               kept=[{"namespace": e.namespace, "key": e.key.hex(), "size": e.size}
                     for e in kept])
    return row


def _purge_tables(console: Console, report: list[dict[str, Any]],
                  document: dict[str, Any], model: str | None) -> None:
    for row in report:
        title = f"tier {row['tier']} ({row['backend']})"
        if _not_done(row, console):
            continue
        table = Table(title=title, title_justify="left")
        for column in ("namespace", "model", "blocks", "bytes"):
            table.add_column(column, overflow="fold")
        for ns in row["namespaces"]:
            table.add_row(ns["namespace"], escape(ns["model"]), str(ns["blocks"]),
                          format_size(ns["bytes"]))
        if row["namespaces"]:
            console.print(table)
        console.print(f"{escape(title)}: removed {row['removed_blocks']} block(s), freed "
                      f"{format_size(row['freed_bytes'])}"
                      + (f"; {row['undated']} block(s) have no stored time and were kept"
                         if row["undated"] else ""))
        if row["kept"]:
            console.print(f"error: {len(row['kept'])} block(s) matched could not be removed "
                          "and are still held; check their files' permissions and the device")
        for ns, blocks in sorted(row["undescribed"].items()):
            console.print(f"error: namespace {ns}: {blocks} block(s) kept, its descriptor is "
                          f"missing, so whether they are model {escape(repr(model))}'s is "
                          f"unknown; purge them with --namespace {ns}")
    console.print(f"total: removed {document['removed_blocks']} block(s), freed "
                  f"{format_size(document['freed_bytes'])}")
