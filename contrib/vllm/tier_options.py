"""The options of a ``secondary_tiers`` entry for ``KvtierTier``, checked.

Each option is documented on :class:`TierOptions`; they are ``KvtierTier``'s
keyword arguments, whose defaults live there.  Checking them here, before
anything is opened, means a bad entry stops vLLM at start-up with an error
naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtier.spec import ConfigError

from ._compat import HAS_DEFERRED_RELEASE, VLLM_VERSION, locality_of

__all__ = ["TierOptions"]


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
    ) -> TierOptions:
        """The options of the tier named ``tier_type``; ConfigError names a bad one."""
        if not config:
            raise ConfigError(
                f"secondary tier {tier_type!r} needs 'config': the path of a kvtier YAML"
            )
        return cls(
            config=config,
            namespace_extra=namespace_extra,
            model_name=model_name,
            keep_host_tier=keep_host_tier,
            locality=None if locality is None else locality_of(locality),
            lookup_timeout=_seconds(tier_type, "lookup_timeout", lookup_timeout),
            verdict_ttl=_seconds(tier_type, "verdict_ttl", verdict_ttl),
            failed_ttl=_seconds(tier_type, "failed_ttl", failed_ttl),
            load_timeout=_load_timeout(tier_type, load_timeout),
            job_workers=job_workers,
            reopen_interval=_seconds(tier_type, "reopen_interval", reopen_interval),
        )


def _seconds(tier_type: str, name: str, value: Any) -> float:
    """``value`` as seconds: a finite number, 0 or more (JSON lets NaN and Infinity in)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"secondary tier {tier_type!r}: {name!r}: expected a finite number "
                          f"of seconds, 0 or more, got {value!r}")
    return seconds


def _load_timeout(tier_type: str, value: float | None) -> float | None:
    if value is None:
        return None
    seconds = _seconds(tier_type, "load_timeout", value)
    if not HAS_DEFERRED_RELEASE:  # without it a late read could write into reused slots
        raise ConfigError(
            f"'load_timeout' needs vLLM 0.34 or later (JobResult.deferred_release); "
            f"this is vLLM {VLLM_VERSION}"
        )
    return seconds
