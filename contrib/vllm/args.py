"""From a kvtier YAML to vLLM's ``kv_transfer_config``; no vLLM import needed.

:func:`kv_transfer_config` builds the dict, :func:`complete_extra_config`
fills what a short hand-written config leaves out (the spec calls it inside
vLLM), and ``vllm_args_command`` (``kvtier vllm-args tiers.yaml``) prints
both the command-line flag and the Python equivalent.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pprint
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
    "CACHE_POLICY_MODULE",
    "DEFAULT_PRIMARY_BYTES",
    "PREFIX_FIELDS",
    "SPEC_MODULE",
    "SPEC_NAME",
    "TIER_MODULE",
    "TIER_TYPE",
    "complete_extra_config",
    "keep_prefix",
    "kv_transfer_config",
    "primary_settings",
    "secondary_chain_config",
    "vllm_args_command",
]

SPEC_NAME = "KvtierOffloadingSpec"
SPEC_MODULE = "kvtier.contrib.vllm.spec"
TIER_TYPE = "KvtierTier"
TIER_MODULE = "kvtier.contrib.vllm.tier"

#: Size of vLLM's CPU (primary) tier when the chain does not start with a
#: ``host`` tier and ``cpu_bytes_to_use`` is not given.
DEFAULT_PRIMARY_BYTES = 1 << 30

#: The module of kvtier's policies for vLLM's CPU tier (``cache_policy_module_path``).
CACHE_POLICY_MODULE = "kvtier.contrib.vllm.cache_policy"

#: What vLLM hashes into a block's key besides the tokens: a ``keep_prefixes``
#: entry's own fields (:mod:`.keep_prefixes`).
PREFIX_FIELDS = ("cache_salt",)

#: vLLM's ``eviction_policy`` for each kvtier host ``eviction``: vLLM's
#: built-in ``lru`` and ``arc``, and kvtier's own policies (classes of
#: :data:`CACHE_POLICY_MODULE`) for those vLLM lacks.
_EVICTION = {"lru": "lru", "arc": "arc", "s3fifo": "S3FifoCachePolicy",
             "adaptive": "AdaptiveCachePolicy"}


def _load(config: str | os.PathLike[str] | ChainConfig) -> ChainConfig:
    return config if isinstance(config, ChainConfig) else load_config(config)


def primary_settings(config: str | os.PathLike[str] | ChainConfig) -> dict[str, Any]:
    """``cpu_bytes_to_use`` (and ``eviction_policy``) for vLLM's CPU tier.

    A chain that starts with a ``host`` tier gives its capacity (and its
    eviction policy) to vLLM's CPU tier, which then *is* that RAM tier; the
    chain the secondary tier opens skips it (:func:`secondary_chain_config`),
    so no block is held twice in RAM.  ``eviction: s3fifo`` or ``adaptive``
    also sets ``cache_policy_module_path``: vLLM then runs kvtier's policy
    (:mod:`kvtier.contrib.vllm.cache_policy`).  Otherwise the CPU tier gets
    :data:`DEFAULT_PRIMARY_BYTES`.
    """
    chain = _load(config)
    first = chain.tiers[0]
    if first.backend != "host":
        return {"cpu_bytes_to_use": DEFAULT_PRIMARY_BYTES}
    out: dict[str, Any] = {"cpu_bytes_to_use": int(first.options["capacity"])}
    eviction = _EVICTION.get(str(first.options.get("eviction") or "lru"))
    if eviction is not None:
        out["eviction_policy"] = eviction
        if eviction not in ("lru", "arc"):
            out["cache_policy_module_path"] = CACHE_POLICY_MODULE
    return out


def secondary_chain_config(
    config: str | os.PathLike[str] | ChainConfig, *, keep_host_tier: bool = False
) -> ChainConfig:
    """The chain behind vLLM's secondary tier: the YAML's, less a leading ``host`` tier.

    ``keep_host_tier=True`` keeps it (a second RAM copy of every block, in
    the scheduler process, on top of vLLM's CPU tier).
    """
    chain = _load(config)
    if keep_host_tier or chain.tiers[0].backend != "host":
        return chain
    rest = chain.tiers[1:]
    if not rest:
        raise ConfigError(
            "the chain holds only a host tier, and vLLM's CPU tier takes its place; "
            "add a tier below it (fs, object, ...) for vLLM to offload to",
            where=chain.source,
            key="chain",
        )
    return dataclasses.replace(chain, tiers=rest)  # load policy, recording: all kept


def _is_kvtier_tier(entry: Any) -> bool:
    return isinstance(entry, Mapping) and entry.get("type") == TIER_TYPE


def complete_extra_config(extra: Mapping[str, Any]) -> dict[str, Any]:
    """``kv_connector_extra_config`` with what ``kvtier_config`` implies filled in.

    Given ``kvtier_config`` (a YAML path), adds a ``secondary_tiers`` entry for
    :data:`TIER_TYPE` if there is none, and ``cpu_bytes_to_use`` /
    ``eviction_policy`` from :func:`primary_settings` where not given; a
    listed :data:`TIER_TYPE` entry without ``config`` gets that path, and one
    with a ``config`` supplies the YAML when ``kvtier_config`` is absent.
    Explicit keys always win.  Without any kvtier YAML the settings are
    vLLM's own (the spec then only adds CPU support).  Returns a new dict.
    """
    out = dict(extra)
    given = out.get("cpu_bytes_to_use")
    if isinstance(given, float) and not math.isfinite(given):  # JSON lets NaN, Infinity in
        _byte_count(given)
    tiers = [dict(t) if isinstance(t, Mapping) else t for t in out.get("secondary_tiers") or []]
    ours = [t for t in tiers if _is_kvtier_tier(t)]
    path = out.get("kvtier_config")
    if path is None:
        path = next((t["config"] for t in ours if t.get("config")), None)
    if path is None:
        if ours:
            raise ConfigError(
                f"a secondary tier of type {TIER_TYPE!r} needs 'config' (the path of a "
                "kvtier YAML), or kv_connector_extra_config needs 'kvtier_config'"
            )
        return out
    path = os.fspath(path)
    if not ours:
        tiers.append({"type": TIER_TYPE, "module_path": TIER_MODULE, "config": path})
    for tier in ours:
        tier.setdefault("module_path", TIER_MODULE)
        tier.setdefault("config", path)
    out["secondary_tiers"] = tiers
    if "cpu_bytes_to_use" not in out or "eviction_policy" not in out:
        settings = primary_settings(path)
        if "eviction_policy" in out:  # the module path goes with the YAML's policy only
            settings.pop("cache_policy_module_path", None)
        for key, value in settings.items():
            out.setdefault(key, value)
    return out


def keep_prefix(entry: Any, tenant: str | None = None, *,
                trust_client_tenant: bool | None = None) -> dict[str, Any]:
    """A ``keep_prefixes`` entry for a tier of ``tenant`` (None: the default), checked
    as the tier checks it, its ``token_ids_file`` absolute.

    A tier that ignores clients' tenants (``trust_client_tenant=False``) sees every
    request as its own tenant's, so a prefix named for another would keep nothing: a
    ValueError says so, as it says what else is wrong.  A tier that trusts them may
    be sent any tenant's requests.
    """
    prefix, portable = check_prefix(entry, PREFIX_FIELDS)
    engine = tenant or DEFAULT_TENANT
    if trust_client_tenant is False and prefix.tenant not in (None, engine):
        raise ValueError(f"tenant {prefix.tenant!r} is not the engine's ({engine!r}): an "
                         "engine that ignores clients' tenants serves its own only, so the "
                         "prefix would keep nothing; name it in an engine of that tenant")
    return portable


def kv_transfer_config(
    path: str | os.PathLike[str],
    *,
    cpu_bytes_to_use: int | None = None,
    namespace_extra: Mapping[str, str] | None = None,
    model_name: str | None = None,
    tenant: str | None = None,
    trust_client_tenant: bool | None = None,
    shared_tenants: list[str] | None = None,
    keep_prefixes: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """vLLM's ``kv_transfer_config`` (as a dict) that offloads to the chain in ``path``.

    The YAML is validated here; its path is made absolute so the engine may
    run from another directory.  Use it as ``KVTransferConfig(**result)`` or
    ``--kv-transfer-config "$(json)"``.  ``tenant``, ``trust_client_tenant``
    and ``shared_tenants`` are the tier's tenant options
    (:class:`~kvtier.contrib.vllm.tier_options.TierOptions`), set where given;
    ``keep_prefixes`` the prefixes it keeps, each checked by :func:`keep_prefix`.
    """
    absolute = os.path.abspath(os.fspath(path))
    chain = load_config(absolute)
    secondary_chain_config(chain)  # refuse a host-only chain now, not in the engine
    tier: dict[str, Any] = {"type": TIER_TYPE, "module_path": TIER_MODULE, "config": absolute}
    if namespace_extra:
        tier["namespace_extra"] = {str(k): str(v) for k, v in namespace_extra.items()}
    if model_name:
        tier["model_name"] = model_name
    tenancy = {"tenant": tenant, "trust_client_tenant": trust_client_tenant,
               "shared_tenants": shared_tenants}
    for name in [tenant or DEFAULT_TENANT, *(shared_tenants or ())]:
        try:
            check_tenant(name)
        except ValueError as exc:
            raise ConfigError(str(exc), key="tenant") from exc
    tier.update((k, v) for k, v in tenancy.items() if v is not None)
    kept = []
    for index, entry in enumerate(keep_prefixes):
        try:
            kept.append(keep_prefix(entry, tenant, trust_client_tenant=trust_client_tenant))
        except ValueError as exc:
            raise ConfigError(f"prefix {index}: {exc}", key="keep_prefixes") from exc
    if kept:
        tier["keep_prefixes"] = kept
    extra: dict[str, Any] = {
        "spec_name": SPEC_NAME,
        "spec_module_path": SPEC_MODULE,
        "kvtier_config": absolute,
        **primary_settings(chain),
        "secondary_tiers": [tier],
    }
    if cpu_bytes_to_use is not None:
        extra["cpu_bytes_to_use"] = _byte_count(cpu_bytes_to_use)
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def _byte_count(value: Any) -> int:
    """``cpu_bytes_to_use`` as a whole number of bytes: NaN, infinity, fractions refused."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0 or value != int(value)):
        raise ConfigError(f"expected a whole number of bytes, 0 or more, got {value!r}",
                          key="cpu_bytes_to_use")
    return int(value)


def _python_literal(config: Mapping[str, Any]) -> str:
    extra = pprint.pformat(dict(config["kv_connector_extra_config"]), sort_dicts=False, width=88)
    body = "\n    ".join(extra.splitlines())
    return (
        "from vllm.config import KVTransferConfig\n\n"
        "kv_transfer_config = KVTransferConfig(\n"
        f"    kv_connector={config['kv_connector']!r},\n"
        f"    kv_role={config['kv_role']!r},\n"
        f"    kv_connector_extra_config={body},\n"
        ")"
    )


@click.command("vllm-args")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["both", "json", "python"]),
    default="both",
    show_default=True,
    help="json: only the --kv-transfer-config value; python: only the KVTransferConfig code.",
)
@click.option(
    "--cpu-bytes",
    type=int,
    default=None,
    help="Size vLLM's CPU tier explicitly (default: the chain's leading host tier).",
)
@click.option(
    "--model-name",
    default=None,
    help="The model's identity for stored blocks (default: the model name vLLM is given).",
)
@click.option(
    "--tenant",
    default=None,
    help="The tenant of requests that name none in kv_transfer_params (default: 'default').",
)
@click.option(
    "--ignore-client-tenants",
    is_flag=True,
    help="Every request is --tenant's, whatever its kv_transfer_params say (no trusted "
         "gateway in front of the engine).",
)
@click.option(
    "--keep-prefix",
    "keep",
    multiple=True,
    metavar="SPEC",
    help="A prefix the tier keeps (repeatable; its keep_prefixes): KEY=VALUE pairs split "
         "by commas, keys name, tenant, token_ids (a JSON list) or token_ids_file (a JSON "
         "file of one), cache_salt; or the entry as a JSON object.",
)
def vllm_args_command(file: str, fmt: str, cpu_bytes: int | None, model_name: str | None,
                      tenant: str | None, ignore_client_tenants: bool,
                      keep: tuple[str, ...]) -> None:
    """Print the vLLM settings that offload KV cache to the chain in FILE.

    A leading host tier sizes vLLM's own CPU tier instead of becoming a second
    copy in RAM; the tiers below it become one vLLM secondary tier.
    """
    trust = False if ignore_client_tenants else None
    try:  # each checked here, so that an error names the option's value
        prefixes = prefixes_from_texts(
            keep, lambda entry: keep_prefix(entry, tenant, trust_client_tenant=trust))
    except ValueError as exc:
        _fail(str(exc))
    try:
        config = kv_transfer_config(
            file, cpu_bytes_to_use=cpu_bytes, model_name=model_name, tenant=tenant,
            trust_client_tenant=trust, keep_prefixes=prefixes,
        )
    except KvtierError as exc:
        _fail(str(exc))
    flag = json.dumps(config, separators=(",", ":"))
    if fmt == "json":
        click.echo(flag)
        return
    if fmt == "python":
        click.echo(_python_literal(config))
        return
    click.echo("# vllm serve MODEL ... with:")
    click.echo(f"--kv-transfer-config {shlex.quote(flag)}")  # a prefix's name may hold a '
    click.echo("")
    click.echo("# or, in Python:")
    click.echo(_python_literal(config))


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)
