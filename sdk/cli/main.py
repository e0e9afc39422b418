"""The ``kvtier`` command line."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.table import Table

from kvtier import __version__
from kvtier.cli.commands import PluginGroup
from kvtier.cli.conformance import conformance_command
from kvtier.cli.operate_commands import inspect_command, purge_command, scrub_command
from kvtier.console import console
from kvtier.peer.server import serve_command
from kvtier.plan.cli import plan_command, record_events_command
from kvtier.plugins.registry import default_registry
from kvtier.spec import CONTRACT_VERSION, Capabilities, KvtierError, PluginError
from kvtier.tierbench.cli import bench_command

if TYPE_CHECKING:
    from kvtier.config.chain_config import ChainConfig

__all__ = ["main"]


def _fail(exc: Exception) -> None:
    console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}")
    sys.exit(2)


def _capability_text(caps: Capabilities) -> str:
    flags = [
        name
        for name in ("persistent", "shared", "thread_safe", "reports_evictions")
        if getattr(caps, name)
    ]
    if caps.max_block_size:
        flags.append(f"max_block={caps.max_block_size}")
    if caps.eviction is not None:
        flags.append(f"eviction={caps.eviction}")
    if caps.capacity_scope != "namespace":  # the contract's rule goes without saying
        flags.append(f"capacity_scope={caps.capacity_scope}")
    flags.extend(f"{k}={v}" for k, v in caps.extra.items())
    return ", ".join(flags) or "-"


@click.group(cls=PluginGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__, prog_name="kvtier", message=f"%(prog)s %(version)s (contract {CONTRACT_VERSION})"
)
def cli() -> None:
    """kvtier: storage tiers for LLM KV cache."""


@cli.command()
def backends() -> None:
    """List installed backends, who provides them, their options and capabilities."""
    registry = default_registry()
    table = Table(title=f"kvtier backends (contract {CONTRACT_VERSION})")
    for column in ("backend", "provided by", "entry point", "options", "capabilities"):
        table.add_column(column, overflow="fold")
    for name in registry.names():
        try:
            info = registry.info(name)
            handle = registry.create(name)
            options = ", ".join(  # the keys a file writes (not the old names, nor internal)
                f"{opt.key or key}{'*' if opt.required else ''}:{opt.type}"
                for key, opt in handle.options().items() if not opt.internal
            )
        except PluginError as exc:
            table.add_row(name, "-", "-", f"[red]{escape(str(exc))}[/]", "-")
            continue
        try:
            caps = _capability_text(handle.capabilities())
        except Exception:  # a backend may only know its capabilities once opened
            caps = "(known once opened)"
        provider = f"{info.distribution} {info.version}" if info.distribution else "-"
        table.add_row(name, provider, info.value, escape(options or "-"), escape(caps))
    out = console()
    out.print(table)
    out.print("* required option", style="dim")


@cli.group()
def config() -> None:
    """Check and explain chain configuration files."""


def _validated(file: str) -> ChainConfig:
    """FILE's chain; else every problem on stderr, a line each, and exit 2."""
    from kvtier.config.chain_config import validate_config

    try:
        loaded, problems = validate_config(file)
    except KvtierError as exc:  # a backend that cannot be loaded
        _fail(exc)
        raise
    if problems or loaded is None:
        err = console(stderr=True)
        for problem in problems:
            err.print(f"[bold red]error:[/] {escape(str(problem))}")
        err.print(escape(f"{file}: {len(problems)} problem(s)"))
        sys.exit(2)
    return loaded


@config.command()
@click.argument("file", type=click.Path(dir_okay=False))
def validate(file: str) -> None:
    """Validate FILE without opening anything; exit 2 with every problem, sorted by line.

    Each problem names the file, the line, the key and the tier.
    """
    loaded = _validated(file)
    names = " -> ".join(t.name for t in loaded.tiers)
    console().print(escape(f"{file}: OK, {len(loaded.tiers)} tier(s): {names}"))


@config.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON document.")
def explain(file: str, as_json: bool) -> None:
    """Every effective setting of every tier in FILE, and of the chain, with its source.

    The source is the default, the file (with its line) or the environment
    (a ${VAR} in the file, named); secret options show ***.  A file with
    problems exits 2 with every problem, as validate does.
    """
    from kvtier.config.explain import explain as settings_of

    loaded = _validated(file)
    rows = settings_of(loaded)
    if as_json:
        click.echo(json.dumps({"file": file, "settings": [r.as_json() for r in rows]},
                              indent=2))
        return
    table = Table(title=f"settings of the chain in {file} (tiers top to bottom, then the chain)")
    for column in ("tier", "key", "value", "source", "line"):
        table.add_column(column, overflow="fold")
    for row in rows:
        source = f"env ({', '.join(row.variables)})" if row.variables else row.source
        line = (row.where or "-").removeprefix(f"{file}:")  # the title names the file
        table.add_row(*(escape(c) for c in (row.tier, row.key, row.value, source, line)))
    console().print(table)


# The built-in commands; these modules import their heavy dependencies (pytest)
# only when run.  The integrations' commands (vllm-args, calibrate, sglang-args,
# lmcache-args) come through the kvtier.commands entry points (kvtier.cli.commands),
# so the command line imports no integration.
for _command in (bench_command, conformance_command, inspect_command, scrub_command,
                 purge_command, serve_command, plan_command, record_events_command):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``kvtier`` script."""
    cli.main(args=argv, prog_name="kvtier")


if __name__ == "__main__":
    main()
