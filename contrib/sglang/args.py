"""The SGLang flags that put a kvtier chain under HiCache, and ``kvtier sglang-args``."""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any

import click

from kvtier.config import load_config
from kvtier.spec import KvtierError

__all__ = [
    "BACKEND_CLASS",
    "BACKEND_MODULE",
    "BACKEND_NAME",
    "extra_config",
    "sglang_args",
    "sglang_args_command",
]

BACKEND_NAME = "kvtier"
BACKEND_MODULE = "kvtier.contrib.sglang"
BACKEND_CLASS = "KvtierStorage"

#: Host-pool layouts whose pages are a few large regions (v1 stores one block
#: per region): ``layer_first`` makes one block per layer and K/V instead.
_LAYOUTS = ("page_first", "page_first_direct", "layer_first")


def extra_config(config: str | os.PathLike[str], *, interface_v1: bool = True) -> dict[str, Any]:
    """``--hicache-storage-backend-extra-config`` for the chain in YAML file ``config``.

    The file is validated first (a bad file raises :class:`~kvtier.spec.ConfigError`
    naming its line) and referred to by absolute path, since SGLang's ranks
    may start in another directory.
    """
    absolute = os.path.abspath(os.fspath(config))
    load_config(absolute)
    out: dict[str, Any] = {
        "backend_name": BACKEND_NAME,
        "module_path": BACKEND_MODULE,
        "class_name": BACKEND_CLASS,
        "kvtier_config": absolute,
    }
    if interface_v1:
        out["interface_v1"] = 1
    return out


def sglang_args(
    config: str | os.PathLike[str], *, layout: str = "page_first", interface_v1: bool = True
) -> list[str]:
    """The ``sglang.launch_server`` arguments (a list, unquoted) for the chain in ``config``."""
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
    extra = extra_config(config, interface_v1=interface_v1)
    args = ["--enable-hierarchical-cache", "--hicache-mem-layout", layout]
    if layout == "page_first_direct":
        args += ["--hicache-io-backend", "direct"]
    args += [
        "--hicache-storage-backend", "dynamic",
        "--hicache-storage-backend-extra-config", json.dumps(extra, separators=(",", ":")),
    ]
    return args


@click.command("sglang-args")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--layout",
    type=click.Choice(_LAYOUTS),
    default="page_first",
    show_default=True,
    help="SGLang host-pool layout; page_first stores two blocks (K, V) per page.",
)
@click.option(
    "--v0",
    "use_v0",
    is_flag=True,
    help="Use SGLang's copying v0 calls instead of the zero-copy v1 calls.",
)
def sglang_args_command(file: str, layout: str, use_v0: bool) -> None:
    """Print the SGLang flags that make the chain in FILE HiCache's storage (L3)."""
    try:
        args = sglang_args(file, layout=layout, interface_v1=not use_v0)
        chain = load_config(os.path.abspath(file))
    except KvtierError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    click.echo("# python -m sglang.launch_server --model-path MODEL ... with:")
    click.echo(" ".join(shlex.quote(a) for a in args))
    if chain.tiers[0].backend == "host":
        click.echo(
            "# note: SGLang's host pool (--hicache-ratio / --hicache-size) already keeps "
            "pages in RAM;\n# the chain's leading host tier keeps a second RAM copy per rank."
        )
