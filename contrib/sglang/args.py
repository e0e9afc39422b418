"""The SGLang flags that put a kvtier chain under HiCache, and ``kvtier sglang-args``."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import click

from kvtier.block.namespace import DEFAULT_TENANT, check_tenant
from kvtier.config import ChainConfig, load_config
from kvtier.config.prefixes import check_prefix, prefixes_from_texts
from kvtier.spec import ConfigError, KvtierError

__all__ = [
    "BACKEND_CLASS",
    "BACKEND_MODULE",
    "BACKEND_NAME",
    "PREFIX_FIELDS",
    "extra_config",
    "host_pool_gb",
    "keep_prefix",
    "sglang_args",
    "sglang_args_command",
    "storage_chain",
]

BACKEND_NAME = "kvtier"
BACKEND_MODULE = "kvtier.contrib.sglang"
BACKEND_CLASS = "KvtierStorage"

#: Host-pool layouts whose pages are a few large regions (v1 stores one block
#: per region): ``layer_first`` makes one block per layer and K/V instead.
_LAYOUTS = ("page_first", "page_first_direct", "layer_first")

#: What SGLang hashes into a page key besides the tokens: a ``keep_prefixes``
#: entry's own fields (:mod:`.keep`).
PREFIX_FIELDS = ("extra_key", "cache_salt")


def storage_chain(chain: ChainConfig, *, keep_host_tier: bool = False) -> ChainConfig:
    """The chain under SGLang's host pool: the YAML's, less a leading ``host`` tier.

    SGLang's host pool (its L2, sized by ``--hicache-size``) already keeps
    pages in RAM; a leading host tier would keep a second copy of the same
    pages in each rank.  ``keep_host_tier=True`` keeps it anyway.
    """
    if keep_host_tier or chain.tiers[0].backend != "host":
        return chain
    rest = chain.tiers[1:]
    if not rest:
        raise ConfigError(
            "the chain holds only a host tier, and SGLang's host pool takes its place; "
            "add a tier below it (fs, object, ...) for HiCache to store pages in",
            where=chain.source,
            key="chain",
        )
    return ChainConfig(tiers=rest, metrics=chain.metrics, source=chain.source)


def host_pool_gb(chain: ChainConfig) -> int | None:
    """``--hicache-size`` (whole GB per rank) from a leading host tier's capacity, if any."""
    first = chain.tiers[0]
    if first.backend != "host":
        return None
    return max(1, int(first.options["capacity"]) // 10**9)


def keep_prefix(entry: Any, tenant: str | None = None) -> dict[str, Any]:
    """A ``keep_prefixes`` entry for an engine of ``tenant`` (None: the default), checked
    as the backend checks it, its ``token_ids_file`` absolute.

    SGLang's storage calls carry no request, so a prefix named for another
    tenant than the engine's would keep nothing: a ValueError says so, as it
    says what else is wrong.
    """
    prefix, portable = check_prefix(entry, PREFIX_FIELDS)
    engine = tenant or DEFAULT_TENANT
    if prefix.tenant is not None and prefix.tenant != engine:
        raise ValueError(f"tenant {prefix.tenant!r} is not the engine's ({engine!r}): every "
                         "page SGLang stores is the engine's tenant's, so the prefix would "
                         "keep nothing; name it in an engine of that tenant")
    return portable


def extra_config(
    config: str | os.PathLike[str], *, interface_v1: bool = True, keep_host_tier: bool = False,
    tenant: str | None = None, keep_prefixes: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """``--hicache-storage-backend-extra-config`` for the chain in YAML file ``config``.

    The file is validated first (a bad file raises :class:`~kvtier.spec.ConfigError`
    naming its line) and referred to by absolute path, since SGLang's ranks
    may start in another directory.  ``tenant`` is the engine's tenant:
    every page it stores and reads is that tenant's.  ``keep_prefixes`` are
    the prefixes it keeps, each checked by :func:`keep_prefix`.
    """
    absolute = os.path.abspath(os.fspath(config))
    storage_chain(load_config(absolute), keep_host_tier=keep_host_tier)
    out: dict[str, Any] = {
        "backend_name": BACKEND_NAME,
        "module_path": BACKEND_MODULE,
        "class_name": BACKEND_CLASS,
        "kvtier_config": absolute,
    }
    if interface_v1:
        out["interface_v1"] = 1
    if keep_host_tier:
        out["keep_host_tier"] = True
    if tenant is not None:
        try:
            out["tenant"] = check_tenant(tenant)
        except ValueError as exc:
            raise ConfigError(str(exc), key="tenant") from exc
    kept = []
    for index, entry in enumerate(keep_prefixes):
        try:
            kept.append(keep_prefix(entry, tenant))
        except ValueError as exc:
            raise ConfigError(f"prefix {index}: {exc}", key="keep_prefixes") from exc
    if kept:
        out["keep_prefixes"] = kept
    return out


def sglang_args(
    config: str | os.PathLike[str], *, layout: str = "page_first", interface_v1: bool = True,
    tenant: str | None = None, keep_prefixes: Sequence[Mapping[str, Any]] = (),
) -> list[str]:
    """The ``sglang.launch_server`` arguments (a list, unquoted) for the chain in ``config``."""
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
    extra = extra_config(config, interface_v1=interface_v1, tenant=tenant,
                         keep_prefixes=keep_prefixes)
    args = ["--enable-hierarchical-cache", "--hicache-mem-layout", layout]
    size_gb = host_pool_gb(load_config(extra["kvtier_config"]))
    if size_gb is not None:
        args += ["--hicache-size", str(size_gb)]
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
@click.option(
    "--tenant",
    default=None,
    help="The engine's tenant: SGLang names none per request, so all its pages are this one's.",
)
@click.option(
    "--keep-prefix",
    "keep",
    multiple=True,
    metavar="SPEC",
    help="A prefix the engine keeps (repeatable; the extra config's keep_prefixes): "
         "KEY=VALUE pairs split by commas, keys name, tenant, token_ids (a JSON list) or "
         "token_ids_file (a JSON file of one), extra_key, cache_salt; or the entry as a JSON "
         "object.",
)
def sglang_args_command(
    file: str, layout: str, use_v0: bool, tenant: str | None, keep: tuple[str, ...]
) -> None:
    """Print the SGLang flags that make the chain in FILE HiCache's storage (L3)."""
    if tenant is not None:
        try:
            check_tenant(tenant)
        except ValueError as exc:
            _fail(f"--tenant: {exc}")
    try:  # each checked here, so that an error names the option's value
        prefixes = prefixes_from_texts(keep, lambda entry: keep_prefix(entry, tenant))
    except ValueError as exc:
        _fail(str(exc))
    try:
        args = sglang_args(file, layout=layout, interface_v1=not use_v0, tenant=tenant,
                           keep_prefixes=prefixes)
    except KvtierError as exc:
        _fail(str(exc))
    click.echo("# python -m sglang.launch_server --model-path MODEL ... with:")
    click.echo(" ".join(shlex.quote(a) for a in args))
    if "--hicache-size" in args:
        click.echo(
            "# the chain's leading host tier sizes SGLang's host pool (--hicache-size, GB per "
            "rank);\n# the storage chain starts below it, so no page is kept twice in RAM."
        )


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)
