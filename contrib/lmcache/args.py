"""``kvtier lmcache-args tiers.yaml``: the ``--l2-adapter`` flag for LMCache's server.

Its options write the adapter's ``adapter_params`` (:mod:`.settings`), tenants
included (:mod:`.tenancy`): ``--tenants-by-salt`` (``tenants: "salt"``),
``--tenant-of-salt SALT=TENANT`` (``tenants: {SALT: TENANT}``, repeatable) and
``--shared-tenant NAME`` (``shared_tenants``, repeatable), so one command
enables tenants too.  The flag printed is checked as LMCache's loader checks it.
"""

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
@click.option("--tenants-by-salt", is_flag=True,
              help="Each cache_salt is a tenant of its own (adapter_params tenants: salt).")
@click.option("--tenant-of-salt", "salt_tenants", multiple=True, metavar="SALT=TENANT",
              help="The keys with this cache_salt are TENANT's (repeatable; adapter_params "
                   "tenants: {SALT: TENANT}); other salts stay the adapter's own tenant's.")
@click.option("--shared-tenant", "shared", multiple=True, metavar="NAME",
              help="A tenant whose blocks every tenant reads, such as a system prompt's "
                   "(repeatable; adapter_params shared_tenants).")
@click.option("--json-only", is_flag=True, help="Print only the --l2-adapter value.")
def lmcache_args_command(
    file: str, namespace: str | None, lock_copies: str | None, tenants_by_salt: bool,
    salt_tenants: tuple[str, ...], shared: tuple[str, ...], json_only: bool
) -> None:
    """Print the LMCache server flag that makes the chain in FILE its L2 adapter."""
    params: dict[str, Any] = {
        k: v for k, v in (("namespace", namespace), ("lock_copies", lock_copies)) if v}
    try:
        tenants = _tenants(tenants_by_salt, salt_tenants)
        if tenants is not None:
            params["tenants"] = tenants
        if shared:
            params["shared_tenants"] = list(dict.fromkeys(shared))
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


def _tenants(by_salt: bool, pairs: tuple[str, ...]) -> str | dict[str, str] | None:
    """``adapter_params.tenants`` from the options; ``ValueError`` naming a bad one."""
    if by_salt and pairs:
        raise ValueError("--tenants-by-salt and --tenant-of-salt exclude each other: a tenant "
                         "per salt, or the salts named")
    if by_salt:
        return "salt"
    if not pairs:
        return None
    mapping: dict[str, str] = {}
    for pair in pairs:
        salt, eq, tenant = pair.rpartition("=")  # a tenant name has no '=', a salt may
        if not eq or not salt:
            raise ValueError(f"--tenant-of-salt {pair!r}: expected SALT=TENANT")
        if mapping.get(salt, tenant) != tenant:
            raise ValueError(f"--tenant-of-salt: salt {salt!r} given to {mapping[salt]!r} "
                             f"and {tenant!r}")
        mapping[salt] = tenant
    return mapping
