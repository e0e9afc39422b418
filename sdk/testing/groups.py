"""The kit's groups and what each one needs of a backend (no pytest import: the CLI uses it).

A group that needs something has a :class:`Gate`: a predicate over what an
open instance declares (its :class:`~kvtier.spec.Capabilities`) and the hooks
it implements, plus the words a report shows.  Adding a group is one name in
:data:`GROUPS`, its gate in :data:`GATES` if it has one, and a mixin class
decorated with :func:`kvtier.testing.base.kit_group` added to
:class:`~kvtier.testing.BackendTests`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from kvtier.spec import Capabilities

from .raw import RAW_ACCESS

__all__ = [
    "CHAIN_OF_ONE",
    "GATES",
    "GROUPS",
    "REQUIREMENTS",
    "SETTINGS",
    "Gate",
    "capacity_scope_of",
    "declares",
    "eviction_of",
    "implements",
    "missing_capability",
]

#: The backend ``kvtier conformance`` certifies a ``framed_only`` backend through.
CHAIN_OF_ONE = "kvtier.testing.through_chain:ChainOfOne"

#: The kit's groups, in the order a report lists them.
GROUPS: tuple[str, ...] = (
    "put_get",
    "lookup",
    "evict",
    "capacity",
    "recency",
    "persistence",
    "shared",
    "concurrency",
    "crash_safety",
    "corruption",
    "stateful",
    "lifecycle",
    "scan",
    "keep",
    "expire",
    "deadlines",
    "framed",
)


@dataclass(frozen=True)
class Gate:
    """What a group needs: ``holds(caps, hooks)`` is true when the group applies.

    ``needs`` is the requirement as reports print it (``persistent=True``);
    ``missing`` completes "backend 'NAME' ..." when it does not hold.
    """

    needs: str
    missing: str
    holds: Callable[[Capabilities, Collection[str]], bool]


def declares(flag: str) -> Gate:
    """A gate on a boolean of :class:`~kvtier.spec.Capabilities` (``persistent``)."""
    if not isinstance(getattr(Capabilities(), flag, None), bool):
        raise ValueError(f"Capabilities has no boolean {flag!r}")
    return Gate(
        f"{flag}=True",
        f"does not declare {flag}=True",
        lambda caps, hooks: bool(getattr(caps, flag)),
    )


def implements(hook: str) -> Gate:
    """A gate on an optional hook (``kvtier_scan``) being implemented."""
    return Gate(hook, f"does not implement {hook}", lambda caps, hooks: hook in hooks)


def _from_extra(caps: Capabilities, name: str) -> str:
    # before eviction and capacity_scope were fields, backends declared them in
    # extra; read there for one release, and say where they go now
    warnings.warn(
        f"Capabilities.extra[{name!r}] is deprecated and no longer read in the next release: "
        f"declare Capabilities({name}=...), a field of its own",
        DeprecationWarning,
        stacklevel=3,
    )
    return str(caps.extra[name])


def eviction_of(caps: Capabilities) -> str | None:
    """The eviction a backend declares: the field, or (deprecated) ``extra["eviction"]``."""
    if caps.eviction is None and "eviction" in caps.extra:
        return _from_extra(caps, "eviction")
    return caps.eviction


def capacity_scope_of(caps: Capabilities) -> str:
    """What a backend's capacity bounds: the field, or (deprecated) ``extra["capacity_scope"]``."""
    if caps.capacity_scope == "namespace" and "capacity_scope" in caps.extra:
        return _from_extra(caps, "capacity_scope")
    return caps.capacity_scope


def _recency_applies(caps: Capabilities) -> bool:
    # a capacity enforced per shard evicts the oldest of a shard, not of the namespace,
    # and one per pool the oldest of every namespace; per process is per namespace here
    return (caps.capacity is not None and eviction_of(caps) == "lru"
            and capacity_scope_of(caps) in ("namespace", "process"))


#: What a group needs the backend to declare or implement; groups not listed need nothing.
GATES: Mapping[str, Gate] = {
    "capacity": Gate(
        "capacity=<bytes>", "declares no capacity", lambda caps, hooks: caps.capacity is not None
    ),
    "recency": Gate(
        "capacity=<bytes>, eviction=lru",
        "declares no capacity with eviction=lru over the namespace",
        lambda caps, hooks: _recency_applies(caps),
    ),
    "persistence": declares("persistent"),
    "shared": declares("shared"),
    "crash_safety": declares("persistent"),
    "concurrency": declares("thread_safe"),
    "corruption": Gate(
        "raw access (kit_tamper)",
        "gives the kit no raw access to its stored bytes: no kit_tamper method "
        "(kvtier.testing.RawAccess), and the test class does not override tamper",
        lambda caps, hooks: RAW_ACCESS in hooks,
    ),
    "scan": implements("kvtier_scan"),
    "keep": implements("kvtier_keep"),
    "expire": implements("kvtier_expire"),
    "deadlines": implements("kvtier_deadlines"),
    "framed": declares("framed_only"),
}

#: The requirement of each gated group, as reports print it.
REQUIREMENTS: Mapping[str, str] = {group: gate.needs for group, gate in GATES.items()}


def missing_capability(
    group: str, label: str, caps: Capabilities, hooks: Collection[str]
) -> str | None:
    """Why ``group`` does not apply to a backend, or None when it does.

    ``hooks`` names the hooks the instance implements, and
    :data:`~kvtier.testing.raw.RAW_ACCESS` when the kit has raw access to it.
    """
    gate = GATES.get(group)
    if gate is not None and not gate.holds(caps, hooks):
        return f"backend {label!r} {gate.missing}"
    if caps.framed_only and group in GROUPS and group != "framed":
        return (
            f"backend {label!r} declares framed_only=True and refuses the kit's raw blocks: "
            f"certify it through a chain of one tier ({CHAIN_OF_ONE}), as kvtier conformance does"
        )
    return None


#: Class attributes of ``BackendTests`` that tune the kit, with their types;
#: ``kvtier conformance --setting NAME=VALUE`` accepts exactly these.
SETTINGS: Mapping[str, type] = {
    "crash_rounds": int,
    "crash_points": int,
    "crash_max_bytes": int,
    "stateful_max_examples": int,
    "stateful_step_count": int,
    "stateful_derandomize": bool,
    "lookup_exact": bool,
    "concurrency_threads": int,
    "concurrency_steps": int,
}
