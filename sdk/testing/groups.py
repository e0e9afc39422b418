"""The kit's groups and the capability each one needs (no pytest import: the CLI uses it)."""

from __future__ import annotations

from collections.abc import Mapping

from kvtier.spec import Capabilities

__all__ = ["GROUPS", "REQUIREMENTS", "SETTINGS", "missing_capability"]

#: The kit's groups, in the order a report lists them.
GROUPS: tuple[str, ...] = (
    "put_get",
    "lookup",
    "evict",
    "capacity",
    "persistence",
    "concurrency",
    "crash_safety",
    "corruption",
    "stateful",
    "lifecycle",
)

#: What a group needs the backend to declare; groups not listed need nothing.
REQUIREMENTS: Mapping[str, str] = {
    "capacity": "capacity=<bytes>",
    "persistence": "persistent=True",
    "crash_safety": "persistent=True",
    "concurrency": "thread_safe=True",
    "corruption": "kvtier_tamper",
}


def missing_capability(group: str, label: str, caps: Capabilities, has_tamper: bool) -> str | None:
    """Why ``group`` does not apply to a backend, or None when it does."""
    need = REQUIREMENTS.get(group)
    if need is None:
        return None
    if need == "kvtier_tamper":
        return None if has_tamper else f"backend {label!r} does not implement kvtier_tamper"
    if need.startswith("capacity"):
        return None if caps.capacity is not None else f"backend {label!r} declares no capacity"
    flag = need.split("=", 1)[0]
    return None if getattr(caps, flag) else f"backend {label!r} does not declare {need}"

#: Class attributes of ``BackendTests`` that tune the kit, with their types;
#: ``kvtier conformance --setting NAME=VALUE`` accepts exactly these.
SETTINGS: Mapping[str, type] = {
    "crash_rounds": int,
    "crash_max_bytes": int,
    "stateful_max_examples": int,
    "stateful_step_count": int,
    "stateful_derandomize": bool,
    "lookup_exact": bool,
    "concurrency_threads": int,
    "concurrency_steps": int,
}
