"""What ``kvtier plan`` and ``kvtier record-events`` check before they start.

Every bad input is a one-line error with exit status 2 that names the option,
or the file and line, before a trace is replayed or an event recorded; an
option that would have no effect is one of them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import click
from click.core import ParameterSource

from kvtier.plugins.options import NotFinite, finite, parse_size

from .chart import chart_missing

__all__ = ["BadInput", "FiniteFloat", "Size", "check_endpoint", "check_unused",
           "check_writable", "given", "parse_generate"]


class BadInput(click.ClickException):
    """A bad trace or a bad combination of options: ``Error: ...``, exit status 2."""

    exit_code = 2


class FiniteFloat(click.ParamType[float]):
    """A finite number of at least ``low``: NaN and infinity are refused."""

    name = "number"

    def __init__(self, low: float = 0.0) -> None:
        self.low = low

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            number = finite(value)  # the options' own check: one wording for NaN and inf
        except NotFinite as exc:
            self.fail(str(exc), param, ctx)
        except (TypeError, ValueError):
            self.fail(f"expected a number, got {value!r}", param, ctx)
        if number < self.low:
            self.fail(f"expected at least {self.low:g}, got {value!r}", param, ctx)
        return number


class Size(click.ParamType[int]):
    """Bytes, as a tier's ``capacity`` takes them: ``64GiB``, ``500MB``, ``4096``."""

    name = "size"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def parse_generate(value: str) -> tuple[str, int, int]:
    """``KIND:REQUESTS[:SEED]`` (``KIND`` alone: 1,000 requests, seed 0)."""
    kind, _, rest = value.partition(":")
    count, _, seed = rest.partition(":")
    try:
        requests, first = int(count or 1000), int(seed or 0)
    except ValueError:
        raise click.BadParameter(f"expected KIND:REQUESTS[:SEED], such as prompts:1000:1, got "
                                 f"{value!r}", param_hint="--generate") from None
    if requests < 1:
        raise click.BadParameter(f"a trace needs at least 1 request, got {requests}",
                                 param_hint="--generate")
    return kind, requests, first


def check_writable(option: str, path: str | None) -> None:
    """That ``path`` can be created: its folder exists and may be written to."""
    if path is None:
        return
    folder = Path(path).parent
    if not folder.is_dir():
        raise click.BadParameter(f"the folder {str(folder)!r} does not exist", param_hint=option)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.BadParameter(f"cannot write in the folder {str(folder)!r}",
                                 param_hint=option)


def given(ctx: click.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source is not ParameterSource.DEFAULT


def check_unused(ctx: click.Context) -> None:
    """Refuse an option the other options leave without effect, naming both."""
    p = ctx.params
    engines, below = p["engines"] is not None, p["below"] is not None

    def refuse(names: Iterable[str], why: str) -> None:
        for name in names:
            if given(ctx, name):
                option = next(o for o in ctx.command.params if o.name == name)
                flag = "/".join(option.opts + option.secondary_opts)
                raise click.UsageError(f"{flag} has no effect {why}", ctx)

    if p["trace"] is not None and p["generated"] is not None:
        raise click.UsageError("give a TRACE file or --generate, not both", ctx)
    if not engines:
        refuse(("router", "balance", "pools"), "without --engines")
    if not (engines or below):
        refuse(("admits", "below_evictions", "write"), "without --below or --engines")
    if engines:
        if given(ctx, "chart") or given(ctx, "admits"):
            raise click.UsageError("--engines prints tables or --json: no --chart or --admit",
                                   ctx)
        refuse(("belady",), "with --engines (Belady's bound is of one cache)")
        if p["capacities"]:
            refuse(("ram",), "with --engines and --capacity (each engine's RAM)")
        if p["router"] == "round-robin":
            refuse(("balance",), "with --router round-robin (it bounds sticky and prefix)")
    missing = chart_missing() if given(ctx, "chart") else None
    if missing is not None:
        raise click.UsageError(f"--chart has no effect: {missing}", ctx)


#: ZeroMQ transports a recorder can connect to or bind.
_ENDPOINT = re.compile(r"^(tcp|ipc|inproc)://\S+$")


def check_endpoint(option: str, endpoint: str | None) -> None:
    if endpoint is not None and not _ENDPOINT.match(endpoint):
        raise click.BadParameter(f"expected a ZeroMQ endpoint such as tcp://127.0.0.1:5557, "
                                 f"got {endpoint!r}", param_hint=option)
