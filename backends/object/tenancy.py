"""The ``object`` tier's tenant: its bound in the bucket, its expiry, and its figures.

A tenant's blocks are a namespace of their own (docs/tenants.md), and an
object instance holds one namespace.  Its bound is ``min(capacity, quota)``
(the ``tenants`` rule of its tenant), counted per process as the capacity is:
each instance enforces it over what it stores and what its LIST finds, and
between two LISTs N writers of one tenant hold at most N x (bound + 2
batches in flight), docs/shared-capacity.md.  Weights give nothing here:
each tenant's namespace has its own bound, so no tenant's writes can evict
another's objects.  A block larger than the bound is refused and counted.

``expire`` (the tier-level setting, :data:`~kvtier.policies.tenancy.EXPIRE_OPTION`)
replaces the old ``max_age``, still read with a warning.  Objects expire
``after`` a time from their last-modified time; ``unused`` is refused, since
S3 keeps no time of a block's last read.  An expired object is a miss for a
get or lookup that finds it, deleted then, and by every cleanup pass.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from kvtier.policies.tenancy import (
    EXPIRE_OPTION,
    TENANT_OPTION,
    TENANTS_OPTION,
    Expiry,
    parse_expiry,
    parse_tenants,
)
from kvtier.spec import Option, Renamed
from kvtier.spec.shared import but

__all__ = ["TENANCY_OPTIONS", "Tenancy"]


def _after_only(expiry: Expiry) -> None:
    if expiry.unused is not None:
        raise ValueError("an object store keeps no time of a block's last read: object "
                         "takes expire: <duration> (after its write) only")


TENANCY_OPTIONS: Mapping[str, Option] = {
    "expire": but(EXPIRE_OPTION, check=_after_only, was=(Renamed("max_age"),)),
    "tenants": TENANTS_OPTION,
    "tenant": TENANT_OPTION,
}


class Tenancy:
    """One instance's tenant: its bound, its expiry, and what was refused, evicted, expired."""

    def __init__(self) -> None:
        self.tenant = "default"
        self.bound: int | None = None  # min(capacity, quota); None: unbounded
        self.after: float | None = None  # seconds from an object's last-modified time
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("refused", "evicted", "expired"), 0)

    def open(self, options: Mapping[str, Any]) -> None:
        self.tenant = options["tenant"]
        quota = parse_tenants(options["tenants"]).quota(self.tenant)
        capacity: int | None = options["capacity"]
        bounds = [b for b in (capacity, quota) if b is not None]
        self.bound = min(bounds) if bounds else None
        self.after = parse_expiry(options["expire"]).after

    def expired(self, last_modified: Any, now: float) -> bool:
        """Whether an object last modified at ``last_modified`` (a datetime) has expired."""
        return self.after is not None and now - last_modified.timestamp() >= self.after

    def count(self, **amounts: int) -> None:
        with self._lock:
            for name, n in amounts.items():
                self._counts[name] += n

    def stats(self, used: int | None) -> dict[str, int]:
        """``expired``, and the tenant's figures as ``tenant_<figure>.<tenant>``."""
        t = self.tenant
        with self._lock:
            out = {"expired": self._counts["expired"],
                   **{f"tenant_{name}.{t}": n for name, n in self._counts.items()}}
        if used is not None:
            out[f"tenant_bytes.{t}"] = used
        return out
