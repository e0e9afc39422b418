"""The options of a ``secondary_tiers`` entry for ``KvtierTier``, declared and checked.

Each option is an :class:`~kvtier.spec.Option` of :data:`OPTIONS`, parsed by
the parser every backend option and chain key goes through
(:func:`kvtier.config.parse_option`), and documented on
:class:`TierOptions`; they are ``KvtierTier``'s keyword arguments, whose
defaults live there.  Checking them here, before anything is opened, means a
bad entry stops vLLM at start-up with an error naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from kvtier.block.namespace import DEFAULT_TENANT, check_tenant
from kvtier.config import parse_option
from kvtier.spec import ConfigError, Option

from ._compat import HAS_DEFERRED_RELEASE, VLLM_VERSION, locality_of
from .keep_prefixes import KeepPrefix, parse_keep_prefixes

__all__ = ["OPTIONS", "TierOptions"]


def _seconds_of(value: Any) -> float:
    """``value`` as seconds: a finite number, 0 or more (JSON lets NaN and Infinity in)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"expected a finite number of seconds, 0 or more, got {value!r}")
    return seconds


def _at_least_one(value: int) -> None:
    if value < 1:
        raise ValueError(f"expected 1 or more threads, got {value}")


def _tenant(value: str) -> None:
    check_tenant(value)


def _tenants(value: list[Any]) -> None:
    for name in value:
        check_tenant(name)


def _seconds(help: str) -> Option:
    # required: KvtierTier passes its default; a None given is no number of seconds
    return Option("duration", help, required=True, parse=_seconds_of)


#: The options of a ``secondary_tiers`` entry, as :class:`TierOptions` documents them.
OPTIONS: Mapping[str, Option] = {
    "config": Option("str", "path of the kvtier YAML", required=True),
    "namespace_extra": Option("map", "extra namespace fields (a deployment tag, a KV quantiser)"),
    "model_name": Option("str", "the model's identity in the namespace, instead of vLLM's "
                         "model name"),
    "keep_host_tier": Option("bool", "open a leading host tier too", default=False),
    "lookup_timeout": _seconds("seconds a lookup may stay unanswered before it is a miss"),
    "verdict_ttl": _seconds("seconds a lookup answer is reused"),
    "failed_ttl": _seconds("seconds a key stays a miss after a failed load"),
    "job_workers": Option("int", "threads running the chain's asynchronous jobs", default=8,
                          check=_at_least_one),
    "reopen_interval": _seconds("seconds between tries to open a chain that failed to open"),
    "locality": Option("str", "LOCAL or REMOTE, passed on to vLLM"),
    "load_timeout": Option("duration", "vLLM 0.34 and later: seconds a load may run before "
                           "the tier reports it failed", parse=_seconds_of),
    "tenant": Option("str", "the tenant of requests that name none (all, without "
                     "trust_client_tenant)", default=DEFAULT_TENANT, check=_tenant),
    "trust_client_tenant": Option("bool", "read each request's tenant from its "
                                  "kv_transfer_params", default=True),
    "shared_tenants": Option("list", "tenants whose blocks are everyone's", default=[],
                             check=_tenants),
    "keep_prefixes": Option("list", "prefixes (token ids) whose blocks a tenant keeps",
                            default=[], parse=parse_keep_prefixes),
}


@dataclass(frozen=True)
class TierOptions:
    """A ``secondary_tiers`` entry's options, as the tier uses them.

    ``config`` (required)
        Path of the kvtier YAML.
    ``namespace_extra``
        Mapping of extra namespace fields (a deployment tag, a KV quantiser).
    ``model_name``
        The model's identity in the namespace instead of vLLM's model name
        (engines loading the same weights from different local paths).
    ``keep_host_tier``
        Open a leading ``host`` tier too (default false: vLLM's CPU tier
        already holds those blocks; see
        :func:`~kvtier.contrib.vllm.args.secondary_chain_config`).
    ``lookup_timeout``
        Seconds a lookup may stay unanswered before it counts as a miss (2).
    ``verdict_ttl``
        Seconds a lookup answer is reused (2).
    ``failed_ttl``
        Seconds a key stays a miss after a failed load (30), so a damaged
        block is not fetched again for every request.
    ``job_workers``
        Threads running the chain's asynchronous jobs (8).
    ``reopen_interval``
        A chain that fails to open at start-up (a ``required`` tier whose
        backend's open fails with an I/O error) does not stop vLLM: the tier
        holds nothing and tries to open the chain again every this many
        seconds (30).  A tier that is not required opens failed instead,
        and the chain retries it alone while its other tiers serve.
    ``locality``
        ``LOCAL`` or ``REMOTE``, passed on to vLLM (default: unset).
    ``load_timeout``
        vLLM 0.34 and later: seconds a load may run before the tier reports
        it failed (vLLM recomputes) with ``deferred_release`` set, so vLLM
        keeps the primary slots out of use until the read has really ended
        (default: unset, a load is reported when it ends).
    ``tenant``
        The tenant of a request whose ``kv_transfer_params`` name none
        (``default``); every request's, without ``trust_client_tenant``.
    ``trust_client_tenant``
        Read each request's tenant from ``kv_transfer_params["kvtier"]["tenant"]``
        (true).  Clients set those params: false ignores them, for an engine
        that clients reach without a trusted gateway (:mod:`.tenancy`).
    ``shared_tenants``
        Tenants whose blocks are everyone's (the ``default`` tenant's namespace).
    ``keep_prefixes``
        Prefixes whose blocks are kept while the tier runs, each a list of token
        ids (``token_ids``, or a JSON file of them, ``token_ids_file``) with its
        ``tenant`` (the tier's), ``cache_salt`` and ``name``, within the tenant's
        ``keep`` budget (:mod:`.keep_prefixes`).
    """

    config: str
    namespace_extra: Mapping[str, Any] | None
    model_name: str | None
    keep_host_tier: bool
    lookup_timeout: float
    verdict_ttl: float
    failed_ttl: float
    job_workers: int
    reopen_interval: float
    #: vLLM's ``Locality``, or None to leave vLLM's default
    locality: Any
    load_timeout: float | None
    tenant: str = DEFAULT_TENANT
    trust_client_tenant: bool = True
    shared_tenants: frozenset[str] = frozenset()
    keep_prefixes: tuple[KeepPrefix, ...] = ()

    @classmethod
    def checked(
        cls,
        tier_type: str,
        *,
        config: str | None,
        namespace_extra: Mapping[str, Any] | None,
        model_name: str | None,
        keep_host_tier: bool,
        lookup_timeout: float,
        verdict_ttl: float,
        failed_ttl: float,
        job_workers: int,
        reopen_interval: float,
        locality: str | None,
        load_timeout: float | None,
        tenant: str = DEFAULT_TENANT,
        trust_client_tenant: bool = True,
        shared_tenants: list[str] | None = None,
        keep_prefixes: list[Any] | None = None,
    ) -> TierOptions:
        """The options of the tier named ``tier_type``; ConfigError names a bad one."""
        if not config:
            raise ConfigError(
                f"secondary tier {tier_type!r} needs 'config': the path of a kvtier YAML"
            )
        given: dict[str, Any] = {
            "config": config, "namespace_extra": namespace_extra, "model_name": model_name,
            "keep_host_tier": keep_host_tier, "lookup_timeout": lookup_timeout,
            "verdict_ttl": verdict_ttl, "failed_ttl": failed_ttl, "job_workers": job_workers,
            "reopen_interval": reopen_interval, "locality": locality,
            "load_timeout": load_timeout, "tenant": tenant,
            "trust_client_tenant": trust_client_tenant, "shared_tenants": shared_tenants,
            "keep_prefixes": keep_prefixes,
        }
        parsed: dict[str, Any] = {}
        for name, opt in OPTIONS.items():
            def fail(reason: str, name: str = name) -> NoReturn:
                raise ConfigError(f"secondary tier {tier_type!r}: {name!r}: {reason}")

            value = given[name]
            if value is None and opt.required and opt.parse is _seconds_of:
                fail(f"expected a finite number of seconds, 0 or more, got {value!r}")
            parsed[name] = parse_option("vllm", name, opt, value, fail)
        locality_name = parsed.pop("locality")
        parsed["shared_tenants"] = frozenset(parsed["shared_tenants"] or ())
        return cls(**{**parsed,
                      "locality": None if locality_name is None else locality_of(locality_name),
                      "load_timeout": _load_timeout(tier_type, parsed["load_timeout"])})


def _load_timeout(tier_type: str, seconds: float | None) -> float | None:
    if seconds is None:
        return None
    if not HAS_DEFERRED_RELEASE:  # without it a late read could write into reused slots
        raise ConfigError(
            f"'load_timeout' needs vLLM 0.34 or later (JobResult.deferred_release); "
            f"this is vLLM {VLLM_VERSION}"
        )
    return seconds
