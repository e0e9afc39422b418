"""``kvtier lmcache-args tiers.yaml``: the ``--l2-adapter`` flag for LMCache's server."""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any

import click

from .settings import AdapterSettings

__all__ = ["ADAPTER_CLASS", "ADAPTER_MODULE", "l2_adapter_spec", "lmcache_args_command"]

ADAPTER_MODULE = "kvtier.contrib.lmcache"
ADAPTER_CLASS = "KvtierL2Adapter"


def l2_adapter_spec(kvtier_config: str | os.PathLike[str], **params: Any) -> dict[str, Any]:
    """The ``--l2-adapter`` object for the chain in ``kvtier_config``, checked first.

    The path becomes absolute (LMCache's server may start elsewhere); extra
    ``params`` (``namespace``, ``lock_copies``, ...) go into ``adapter_params``.
    Raises ``ValueError`` naming the problem, as LMCache itself would at start-up.
    """
    adapter_params = {"kvtier_config": os.path.abspath(os.fspath(kvtier_config)), **params}
    AdapterSettings.from_params(adapter_params)
    return {
        "type": "plugin",
        "module_path": ADAPTER_MODULE,
        "class_name": ADAPTER_CLASS,
        "adapter_params": adapter_params,
    }


@click.command("lmcache-args")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--namespace", default=None,
              help="Model name kept in every block's header (default: lmcache).")
@click.option("--lock-copies", type=click.Choice(["ram", "all"]), default=None,
              help="Which locked blocks the adapter copies (default: ram).")
@click.option("--json-only", is_flag=True, help="Print only the --l2-adapter value.")
def lmcache_args_command(
    file: str, namespace: str | None, lock_copies: str | None, json_only: bool
) -> None:
    """Print the LMCache server flag that makes the chain in FILE its L2 adapter."""
    params = {k: v for k, v in (("namespace", namespace), ("lock_copies", lock_copies)) if v}
    try:
        spec = l2_adapter_spec(file, **params)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    flag = json.dumps(spec, separators=(",", ":"))
    if json_only:
        click.echo(flag)
        return
    click.echo("# lmcache server ... with:")
    click.echo(f"--l2-adapter {shlex.quote(flag)}")
