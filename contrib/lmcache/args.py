"""``kvtier lmcache-args tiers.yaml``: the ``--l2-adapter`` flag for LMCache's server.

Its options write the adapter's ``adapter_params`` (:mod:`.settings`), tenants
included (:mod:`.tenancy`): ``--tenants-by-salt`` (``tenants: "salt"``),
``--tenant-of-salt SALT=TENANT`` (``tenants: {SALT: TENANT}``, repeatable) and
``--shared-tenant NAME`` (``shared_tenants``, repeatable), so one command
enables tenants too; and named prefixes to keep (:mod:`.keep`): ``--keep-prefix
SPEC`` (``keep_prefixes``, repeatable), hashed as the server hashes, by its
``--chunk-size`` and ``--hash-algorithm``.  The flag printed is checked as
LMCache's loader checks it, and a prefix that would keep nothing is refused.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any, NoReturn

import click

from kvtier import Namespace
from kvtier.block.namespace import DEFAULT_TENANT
from kvtier.config.prefixes import check_prefix, prefixes_from_texts

from .prefixes import PREFIX_FIELDS
from .settings import AdapterSettings
from .tenancy import salt_tenant

__all__ = ["ADAPTER_CLASS", "ADAPTER_MODULE", "keep_prefix", "l2_adapter_spec",
           "lmcache_args_command"]

ADAPTER_MODULE = "kvtier.contrib.lmcache"
ADAPTER_CLASS = "KvtierL2Adapter"


def l2_adapter_spec(kvtier_config: str | os.PathLike[str], **params: Any) -> dict[str, Any]:
    """The ``--l2-adapter`` object for the chain in ``kvtier_config``, checked first.

    The path becomes absolute (LMCache's server may start elsewhere); extra
    ``params`` (``namespace``, ``lock_copies``, ...) go into ``adapter_params``.
    Raises ``ValueError`` naming the problem, as LMCache itself would at start-up,
    and for a ``keep_prefixes`` entry that would keep nothing (:func:`keep_prefix`).
    """
    adapter_params = {"kvtier_config": os.path.abspath(os.fspath(kvtier_config)), **params}
    settings = AdapterSettings.from_params(adapter_params)
    if "keep_prefixes" in adapter_params:
        kept = []
        for index, entry in enumerate(adapter_params["keep_prefixes"]):
            try:
                kept.append(keep_prefix(entry, settings))
            except ValueError as exc:
                raise ValueError(f"adapter_params.keep_prefixes: prefix {index}: {exc}") from None
        adapter_params["keep_prefixes"] = kept
    return {
        "type": "plugin",
        "module_path": ADAPTER_MODULE,
        "class_name": ADAPTER_CLASS,
        "adapter_params": adapter_params,
    }


def keep_prefix(entry: Any, settings: AdapterSettings) -> dict[str, Any]:
    """A ``keep_prefixes`` entry for an adapter of ``settings`` (its other params),
    checked as the adapter checks it, its ``token_ids_file`` absolute.

    A ValueError also refuses a prefix that would keep nothing: shorter than a
    chunk (``chunk_size``), or named for a ``tenant`` other than its salt's,
    as the adapter maps salts (the adapter would log that and go on).
    """
    prefix, portable = check_prefix(entry, PREFIX_FIELDS)
    if len(prefix.token_ids) < settings.chunk_size:
        raise ValueError(f"{len(prefix.token_ids)} token ids, less than a chunk of "
                         f"{settings.chunk_size} (the server's --chunk-size): LMCache stores no "
                         "part chunk, so the prefix would keep nothing")
    salt = prefix.fields["cache_salt"] or ""
    owner = (salt_tenant(settings.tenants, settings.shared_tenants, salt)
             or Namespace.of(settings.namespace).tenant)
    named = prefix.tenant  # a shared tenant's blocks are in the default tenant's namespace
    if named is not None and (
            DEFAULT_TENANT if named in settings.shared_tenants else named) != owner:
        raise ValueError(f"tenant {named!r} is not its salt's: the keys of cache_salt "
                         f"{salt!r} are tenant {owner!r}'s, so the prefix would keep nothing")
    return portable


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
@click.option("--keep-prefix", "keep", multiple=True, metavar="SPEC",
              help="A prefix to keep (repeatable; adapter_params keep_prefixes): KEY=VALUE "
                   "pairs split by commas, keys name, tenant, token_ids (a JSON list) or "
                   "token_ids_file (a JSON file of one), cache_salt, model_name; or the entry "
                   "as a JSON object.")
@click.option("--chunk-size", type=int, default=None,
              help="The server's --chunk-size, which prefixes are hashed by (default: 256).")
@click.option("--hash-algorithm", default=None,
              help="The server's --hash-algorithm, which prefixes are hashed by (default: "
                   "blake3).")
@click.option("--json-only", is_flag=True, help="Print only the --l2-adapter value.")
def lmcache_args_command(
    file: str, namespace: str | None, lock_copies: str | None, tenants_by_salt: bool,
    salt_tenants: tuple[str, ...], shared: tuple[str, ...], keep: tuple[str, ...],
    chunk_size: int | None, hash_algorithm: str | None, json_only: bool
) -> None:
    """Print the LMCache server flag that makes the chain in FILE its L2 adapter."""
    params: dict[str, Any] = {
        k: v for k, v in (("namespace", namespace), ("lock_copies", lock_copies)) if v}
    params.update((k, v) for k, v in (("chunk_size", chunk_size),
                                      ("hash_algorithm", hash_algorithm)) if v is not None)
    try:
        tenants = _tenants(tenants_by_salt, salt_tenants)
        if tenants is not None:
            params["tenants"] = tenants
        if shared:
            params["shared_tenants"] = list(dict.fromkeys(shared))
        settings = AdapterSettings.from_params(
            {"kvtier_config": os.path.abspath(file), **params})
    except ValueError as exc:
        _fail(str(exc))
    try:  # each checked here, so that an error names the option's value
        prefixes = prefixes_from_texts(keep, lambda entry: keep_prefix(entry, settings))
    except ValueError as exc:
        _fail(str(exc))
    if prefixes:
        params["keep_prefixes"] = prefixes
    try:
        spec = l2_adapter_spec(file, **params)
    except ValueError as exc:
        _fail(str(exc))
    flag = json.dumps(spec, separators=(",", ":"))
    if json_only:
        click.echo(flag)
        return
    click.echo("# lmcache server ... with:")
    click.echo(f"--l2-adapter {shlex.quote(flag)}")


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


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
